"""A rank's checkpoints: DCP shards saved and committed atomically, loaded at any world size.

The package, by concern:

- :mod:`.storage`: the writer DCP writes with and the commit, per root
  (:class:`~.storage.FileStorage`, :class:`~.storage.ObjectStorage`); tests swap in a
  storage that fails on purpose.
- :mod:`.state`: what a checkpoint holds, taken from the registered objects.
- :mod:`.staging`: copying the tensors of an async save in the background, and
  making what would change them wait for the copy.
- :mod:`.saver`: :class:`~.saver.Saver`, one rank's saves and restores.
- :mod:`.export`: the whole model as plain tensors on rank 0 (``ctx.full_state_dict``).

Where checkpoints are, what they are called, their manifests, which of them are
committed and how many are kept is pure file handling that every tier uses:
:mod:`clustersdk.checkpoint_files`.
"""
