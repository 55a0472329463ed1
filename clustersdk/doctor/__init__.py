"""``doctor``: pre-flight checks of a cluster, per worker and per pair of hosts.

Versions (python, torch, NCCL, CUDA driver, clustersdk...) and whether they
agree; the GPUs NVML sees and their health; every host reaching every other
on the rendezvous port range; free space, writes and sharing at a checkpoint
directory; clock skew; and an all-reduce bus-bandwidth sweep per pair of hosts.
Each problem is one line that names the host and says what to do.

>>> report = cluster.doctor(checkpoint_dir="/shared/runs")   # doctest: +SKIP
>>> print(report)                                            # doctest: +SKIP
"""

from .report import Problem, Report, Sweep, bus_bandwidth, format_report
from .run import adoctor, doctor

__all__ = ["Problem", "Report", "Sweep", "adoctor", "bus_bandwidth", "doctor", "format_report"]
