/**
 * The panel's pure models, in Node's own test runner: what the sidebar and the job
 * panel show for given API JSON (run by `npm test`, which tests/extension runs in CI).
 */

import assert from 'node:assert/strict';
import { describe, test } from 'node:test';

import {
  actionFailed,
  actionStates,
  attachCode,
  clusterView,
  formatBytes,
  formatDuration,
  goodputView,
  IClusterJSON,
  IHistoryRow,
  IJobJSON,
  jobEvents,
  jobMeta,
  progressView,
  sortJobs,
  statusText
} from '../src/models';
import {
  axisRange,
  bandOf,
  chart,
  isThroughput,
  median,
  RunSeries,
  Series,
  svgPath,
  tickLabel,
  ticks
} from '../src/series';

function job(fields: Partial<IJobJSON> = {}): IJobJSON {
  return {
    id: 'a1b2c3',
    name: 'train',
    cluster: 'tcp-127.0.0.1-8786',
    status: 'RUNNING',
    terminal: false,
    reason: '',
    world_size: 4,
    strategy: 'fsdp',
    owner: 'alice',
    submitted: 100,
    started: 101,
    ended: null,
    ranks: [0, 1, 2, 3].map(r => ({ rank: r, worker: `w${r}`, host: 'node1', device: `cuda:${r}` })),
    error: null,
    spec: { checkpoint_dir: '/runs/a', max_restarts: 2 },
    total_steps: 1000,
    progress: { step: 249, steps_per_second: 5, scalars: { loss: 0.5 } },
    ...fields
  };
}

describe('actionStates', () => {
  test('a running job can pause, checkpoint, suspend and stop, not resume', () => {
    const s = actionStates(job());
    assert.deepEqual(
      Object.fromEntries(Object.entries(s).map(([k, v]) => [k, v.enabled])),
      { pause: true, resume: false, checkpoint: true, suspend: true, stop: true }
    );
    assert.equal(s.pause.reason, '');
    assert.match(s.resume.reason, /is RUNNING; only a PAUSED or SUSPENDED job can resume/);
  });

  test('a paused job resumes; its pause button says why it is greyed out', () => {
    const s = actionStates(job({ status: 'PAUSED' }));
    assert.equal(s.resume.enabled, true);
    assert.equal(s.pause.enabled, false);
    assert.equal(
      s.pause.reason,
      'Job train is PAUSED; only a QUEUED, STARTING or RUNNING job can pause'
    );
  });

  test('a queued or starting job can pause, checkpoint and suspend already', () => {
    for (const status of ['QUEUED', 'STARTING']) {
      const s = actionStates(job({ status }));
      assert.deepEqual(
        Object.fromEntries(Object.entries(s).map(([k, v]) => [k, v.enabled])),
        { pause: true, resume: false, checkpoint: true, suspend: true, stop: true }
      );
    }
  });

  test('without checkpoint_dir, checkpoint and suspend say so', () => {
    const s = actionStates(job({ spec: {} }));
    assert.equal(s.checkpoint.enabled, false);
    assert.match(s.suspend.reason, /launched without checkpoint_dir, so it cannot suspend/);
    assert.equal(s.pause.enabled, true);
  });

  test("a script job's buttons are what its ranks accept", () => {
    const plain = actionStates(job({ spec: {}, controls: ['stop', 'suspend'] }));
    assert.equal(plain.stop.enabled, true);
    assert.equal(plain.suspend.enabled, true); // SIGTERM: the script saves where it likes
    assert.equal(plain.pause.enabled, false);
    assert.match(plain.pause.reason, /runs a script that does not accept pause requests/);
    assert.equal(plain.checkpoint.enabled, false);
    const opted = actionStates(
      job({ spec: {}, controls: ['checkpoint', 'pause', 'stop', 'suspend'] })
    );
    assert.equal(opted.pause.enabled, true);
    assert.equal(opted.checkpoint.enabled, true);
    const paused = actionStates(
      job({ status: 'PAUSED', spec: {}, controls: ['checkpoint', 'pause', 'stop', 'suspend'] })
    );
    assert.match(paused.checkpoint.reason, /resume it first/);
  });

  test('a finished job allows nothing', () => {
    const s = actionStates(job({ status: 'FINISHED', terminal: true }));
    assert.ok(Object.values(s).every(v => !v.enabled));
    assert.equal(s.stop.reason, 'Job train is FINISHED: nothing more to stop');
  });

  test('a suspended job can resume or stop, nothing else', () => {
    const s = actionStates(job({ status: 'SUSPENDED' }));
    assert.deepEqual(
      Object.entries(s).filter(([, v]) => v.enabled).map(([k]) => k),
      ['resume', 'stop']
    );
  });

  test('a held job can only be stopped (its post-mortem waits for job.debug)', () => {
    const s = actionStates(job({ status: 'HELD' }));
    assert.deepEqual(
      Object.entries(s).filter(([, v]) => v.enabled).map(([k]) => k),
      ['stop']
    );
  });

  test("someone else's job: every button greyed out, the owner named in the tooltip", () => {
    const refusal = "this job belongs to 'alice'; only its owner or an admin may change it";
    const s = actionStates(job({ owner: 'alice', may_change: false, refusal }));
    assert.ok(Object.values(s).every(v => !v.enabled));
    assert.equal(s.stop.reason, refusal);
    // the owner (or an admin) gets the buttons the state allows
    assert.equal(actionStates(job({ owner: 'alice', may_change: true })).stop.enabled, true);
  });

  test('a refused action names the job, the HTTP status and the reason', () => {
    assert.equal(
      actionFailed('pause', 'train', 409, "job 'train' is FINISHED; it cannot pause"),
      "Could not pause job train (HTTP 409): job 'train' is FINISHED; it cannot pause"
    );
  });
});

describe('progressView', () => {
  test('step, total, rate and ETA of a running job', () => {
    const v = progressView(job());
    assert.equal(v.done, 250);
    assert.equal(v.fraction, 0.25);
    assert.equal(v.stepText, 'step 250 / 1000');
    assert.equal(v.rateText, '5 steps/s');
    assert.equal(v.etaText, 'ETA 2m 30s'); // 750 steps at 5/s
  });

  test('a paused job has no rate and no ETA', () => {
    const v = progressView(job({ status: 'PAUSED' }));
    assert.equal(v.rateText, '');
    assert.equal(v.etaText, '');
    assert.equal(v.stepText, 'step 250 / 1000');
  });

  test('no total: no fraction; no row yet: step 0', () => {
    const v = progressView(job({ total_steps: null, progress: null }));
    assert.equal(v.fraction, null);
    assert.equal(v.stepText, 'step 0');
  });

  test('durations and sizes read as people write them', () => {
    assert.deepEqual(
      [45, 80, 7300, 90000].map(formatDuration),
      ['45s', '1m 20s', '2h 1m', '1d 1h']
    );
    assert.equal(formatBytes(512), '512 B');
    assert.equal(formatBytes(1536), '1.5 KiB');
    assert.equal(formatBytes(3 * 1024 ** 3), '3.0 GiB');
  });
});

describe('clusters', () => {
  const gpuCluster: IClusterJSON = {
    id: 'c1',
    address: 'tcp://10.0.0.5:8786',
    kind: 'connect',
    source: 'registry',
    reachable: true,
    error: null,
    gpus: 2,
    utilisation: { slots: 3, busy: 2 },
    jobs: { RUNNING: 1, QUEUED: 1 },
    slots: [
      {
        worker: 'w0', host: 'node1', kind: 'cuda', index: 0, cpus: '0-3,8-11', job: 'a1b2c3',
        telemetry: { source: 'nvml', gpu_util: 87.5, gpu_mem_used: 6 * 1024 ** 3, gpu_mem_total: 8 * 1024 ** 3 }
      },
      { worker: 'w1', host: 'node1', kind: 'cuda', index: 1, job: null, telemetry: null },
      {
        worker: 'w2', host: 'node2', kind: 'cpu', index: null, cpus: '5', job: 'a1b2c3',
        telemetry: { source: 'psutil', cpu_percent: 50, rss: 1024 ** 3, mem_total: 4 * 1024 ** 3 }
      }
    ]
  };

  test('slots by host, GPU bars from NVML, CPU slots labelled with their own bars', () => {
    const view = clusterView(gpuCluster, [job()]);
    assert.deepEqual(view.hosts.map(h => [h.host, h.slots.map(s => s.label)]), [
      ['node1', ['GPU 0', 'GPU 1']],
      ['node2', ['CPU slot 2']]
    ]);
    const [gpu0, gpu1] = view.hosts[0].slots;
    assert.equal(gpu0.jobName, 'train');
    assert.deepEqual(gpu0.bars, [
      { label: 'util', fraction: 0.875, text: '88%' },
      { label: 'mem', fraction: 0.75, text: '6.0 / 8.0 GiB' }
    ]);
    assert.equal(gpu1.busy, false);
    // the cores each worker is bound to; none shown for one that is not (or an older cluster)
    assert.deepEqual(
      view.hosts.flatMap(h => h.slots.map(s => s.cores)),
      ['cores 0-3,8-11', null, 'core 5']
    );
    assert.deepEqual(gpu1.bars.map(b => b.fraction), [null, null]); // no reading: empty bars
    const cpu = view.hosts[1].slots[0];
    assert.equal(cpu.cpu, true);
    assert.deepEqual(cpu.bars.map(b => b.label), ['host CPU', 'rank mem']);
    assert.equal(view.summary, 'connected · 2 hosts · 2/3 slots busy');
  });

  test("a standing cluster's restarts: counted, the newest messages on hover; none: no line", () => {
    const restarted: IClusterJSON = {
      ...gpuCluster,
      restarts: {
        count: 3,
        recent: [
          { time: 1700000000, message: 'worker tls://a:1 (host a) started again by its supervisor (restart 1)' },
          { time: 1700000100, message: 'scheduler tls://a:2 (host a) started again by its supervisor (restart 1)' }
        ]
      }
    };
    const view = clusterView(restarted, []);
    assert.match(view.restarts?.text ?? '', /^3 restarts of its processes, the last /);
    assert.equal(view.restarts?.detail.split('\n').length, 2);
    assert.match(view.restarts?.detail ?? '', /scheduler tls:\/\/a:2/);
    assert.equal(clusterView({ ...gpuCluster, restarts: { count: 0, recent: [] } }, []).restarts, null);
    assert.equal(clusterView(gpuCluster, []).restarts, null); // an older server: no field
  });

  test("the cluster's Dask dashboard: its link where it serves one, none otherwise", () => {
    const link = 'http://127.0.0.1:40503/status';
    assert.equal(clusterView({ ...gpuCluster, dashboard_link: link }, []).dashboard, link);
    assert.equal(clusterView({ ...gpuCluster, dashboard_link: null }, []).dashboard, null);
    assert.equal(clusterView(gpuCluster, []).dashboard, null); // an older server: no field
  });

  test('an unreachable cluster says so', () => {
    const view = clusterView(
      { id: 'c2', address: 'tcp://x:1', kind: 'remote', source: 'config', reachable: false, error: 'no answer' },
      []
    );
    assert.equal(view.summary, 'configured · unreachable');
    assert.equal(view.error, 'no answer');
  });

  test('the status bar counts running jobs and busy GPUs over reachable clusters', () => {
    const gpusOnly: IClusterJSON = { ...gpuCluster, id: 'c3', gpus: 8, utilisation: { slots: 8, busy: 6 }, jobs: { RUNNING: 1 } };
    assert.equal(statusText([gpusOnly, { ...gpusOnly, id: 'c4' }]), 'clustersdk: 2 running · 12/16 GPUs busy');
    assert.equal(statusText([gpuCluster]), 'clustersdk: 1 running · 2/3 slots busy');
    assert.equal(statusText([]), 'clustersdk: 0 running · 0/0 slots busy');
  });
});

describe('jobs', () => {
  test('live jobs first, newest first; ended ones apart', () => {
    const jobs = [
      job({ id: '1', submitted: 1, status: 'FINISHED' }),
      job({ id: '2', submitted: 2 }),
      job({ id: '3', submitted: 3, status: 'QUEUED' })
    ];
    const { live, ended } = sortJobs(jobs);
    assert.deepEqual(live.map(j => j.id), ['3', '2']);
    assert.deepEqual(ended.map(j => j.id), ['1']);
    assert.equal(jobMeta(job()), 'alice · fsdp · 4 ranks');
  });

  test('the attach code is valid Python that names the address and the job', () => {
    assert.equal(
      attachCode('tcp://127.0.0.1:8786', 'my "run"'),
      'import clustersdk as cs\n\njob = cs.Job.attach(cs.Cluster.connect("tcp://127.0.0.1:8786"), "my \\"run\\"")'
    );
  });

  test('events from the record: pause, checkpoint, restarts, failure', () => {
    const events = jobEvents(job({
      status: 'FAILED', paused_at: null, restarts: 1, checkpoint: '/runs/a/step-00000200',
      checkpoint_step: 200, ended: 300,
      error: { rank: 2, type: 'WorkerLost', message: 'worker w2 left' }
    }));
    assert.deepEqual(events.map(e => e.kind), ['submitted', 'started', 'restarted', 'checkpoint', 'failed']);
    assert.equal(events[2].text, 'restarted 1 time(s) of 2 after a lost worker');
    assert.equal(events[4].text, 'rank 2: WorkerLost: worker w2 left');
    const paused = jobEvents(job({ status: 'PAUSED', paused_at: 42 }));
    assert.ok(paused.some(e => e.kind === 'paused' && e.text === 'paused before step 42'));
  });

  test('the durable events from the API join what the record tells', () => {
    const events = jobEvents(job({
      status: 'FAILED', restarts: 1, checkpoint: '/runs/a/step-00000200', checkpoint_step: 200,
      ended: 300, error: { rank: 1, type: 'WorkerLost', message: 'worker w1 left' },
      events: [
        { time: 50, kind: 'restarted', message: 'worker w2 (host h) of rank 2 left the cluster' },
        { time: 300, kind: 'failed', message: 'rank 1: WorkerLost: worker w1 left' }
      ]
    }));
    assert.deepEqual(events.map(e => e.kind), ['submitted', 'started', 'restarted', 'failed', 'checkpoint']);
    assert.equal(events[2].text, 'worker w2 (host h) of rank 2 left the cluster');
  });
});

function rows(ranks: number, steps: number, value: (rank: number, step: number) => number): IHistoryRow[] {
  const out: IHistoryRow[] = [];
  let seq = 0;
  for (let step = 0; step < steps; step++) {
    for (let rank = 0; rank < ranks; rank++) {
      out.push({ seq: ++seq, rank, step, time: step * 0.1, loss: value(rank, step) });
    }
  }
  return out;
}

describe('series and charts', () => {
  test('a series stays bounded and keeps the newest point', () => {
    const s = new Series(10);
    for (let i = 0; i < 1000; i++) {
      s.add(i, i * 2);
    }
    const all = s.all();
    assert.ok(s.points.length <= 10);
    assert.deepEqual(all[0], [0, 0]);
    assert.deepEqual(all[all.length - 1], [999, 1998]);
    assert.ok(all.every((p, i) => i === 0 || p[0] > all[i - 1][0]));
  });

  test('a resume from an older step replaces the rewound points', () => {
    const s = new Series();
    [0, 1, 2, 3, 4].forEach(i => s.add(i, 1));
    s.add(2, 9);
    assert.deepEqual(s.all(), [[0, 1], [1, 1], [2, 9]]);
  });

  test('history rows become per-rank scalars, throughput and the next cursor', () => {
    const run = new RunSeries();
    run.add(rows(2, 31, (rank, step) => rank + step));
    assert.equal(run.last, 62);
    assert.deepEqual(run.names(), ['loss']);
    assert.deepEqual(run.scalars.get('loss')!.get(1)!.all().slice(0, 2), [[0, 1], [1, 2]]);
    // 10 steps per second per rank (a row every 0.1 s), one point per second
    const rate = run.rate.get(0)!.all();
    assert.deepEqual(rate.map(p => p[0]), [10, 20, 30]);
    assert.ok(rate.every(p => Math.abs(p[1] - 10) < 1e-9));
  });

  test('up to 8 ranks: a line each; past 8: a min/median/max band', () => {
    const few = new RunSeries();
    few.add(rows(8, 20, (r, s) => r * s));
    const lines = chart(few.scalars.get('loss'));
    assert.equal(lines.mode, 'lines');
    assert.equal(lines.lines.length, 8);

    const many = new RunSeries();
    many.add(rows(64, 20, (r, s) => r + s));
    const band = chart(many.scalars.get('loss'), 8, 20);
    assert.equal(band.mode, 'band');
    assert.equal(band.lines.length, 0);
    assert.equal(band.band!.ranks, 64);
    const [, lo, mid, hi] = band.band!.rows[5]; // step 5: values 5..68
    assert.deepEqual([lo, mid, hi], [5, 36.5, 68]);
    assert.deepEqual(band.y, [0, 82]);
  });

  test('bands take each rank once per bin and the median of the values', () => {
    const band = bandOf(
      [
        { rank: 0, points: [[0, 1], [1, 2]] },
        { rank: 1, points: [[0, 3]] },
        { rank: 2, points: [[0, 5]] }
      ],
      [0, 2],
      1
    );
    assert.deepEqual(band.rows, [[1, 2, 3, 5]]); // rank 0's last value in the bin is 2
    assert.equal(median([1, 2, 3, 4]), 2.5);
  });

  test('a throughput axis starts at zero, however steady the rate', () => {
    // the reported chart: one point on an axis from 33.815 to 33.820
    assert.deepEqual(axisRange(33.815, 33.82, 0), [0, 33.82]);
    assert.deepEqual(axisRange(33.8175, 33.8175, 0), [0, 33.8175]);
    assert.deepEqual(axisRange(0, 0, 0), [0, 1]); // a stalled job: a flat line at the bottom
    assert.ok(['throughput', 'steps/s', 'tokens_per_s', 'samples_per_sec'].every(isThroughput));
    assert.ok(!['loss', 'lr', 'grad_norm', 'val_loss'].some(isThroughput));
  });

  test('other axes span at least +-10% of their level, and -1..1 around zero', () => {
    assert.deepEqual(axisRange(5, 5), [4.5, 5.5]); // one point, or a flat line
    const near = (got: [number, number], want: [number, number]) =>
      assert.ok(got.every((v, i) => Math.abs(v - want[i]) < 1e-9), `${got} != ${want}`);
    near(axisRange(2.0001, 2.0002), [1.80013, 2.20017]); // noise in the fourth decimal
    near(axisRange(-3, -3), [-3.3, -2.7]);
    assert.deepEqual(axisRange(0, 0), [-1, 1]);
    assert.deepEqual(axisRange(0.2, 2.5), [0.2, 2.5]); // a wide range is the data's
    assert.deepEqual(axisRange(-1e-3, 1e-3), [-1e-3, 1e-3]);
  });

  test('a chart of one point has a sane axis; its line starts at the second', () => {
    const rate = new Map([[0, new Series()]]);
    rate.get(0)!.add(10, 33.8175);
    const one = chart(rate, 8, 200, 0);
    assert.equal(one.mode, 'lines');
    assert.deepEqual(one.y, [0, 33.8175]);
    assert.ok(one.x[1] > one.x[0]);
    assert.doesNotMatch(svgPath(one.lines[0].points, one.x, one.y, 100, 50), /L/); // no line
    rate.get(0)!.add(20, 33.82);
    const two = chart(rate, 8, 200, 0);
    assert.deepEqual([two.x, two.y], [[10, 20], [0, 33.82]]);
    assert.match(svgPath(two.lines[0].points, two.x, two.y, 100, 50), /^M0\.0,[\d.]+L100\.0,/);

    const loss = new Map([[0, new Series()]]);
    loss.get(0)!.add(0, 2.5);
    assert.deepEqual(chart(loss).y, [2.25, 2.75]);
  });

  test('paths, ticks and their labels', () => {
    assert.equal(svgPath([[0, 0], [10, 5]], [0, 10], [0, 5], 100, 50), 'M0.0,50.0L100.0,0.0');
    assert.deepEqual(ticks(0, 1), [0, 0.5, 1]);
    assert.deepEqual(ticks(21.51, 21.62), [21.55, 21.6]);
    assert.equal(tickLabel(21.55, 0.05), '21.55');
    assert.equal(tickLabel(2000, 500), '2000');
    assert.equal(chart(undefined).mode, 'empty');
  });
});

describe('goodputView', () => {
  const withGoodput = (goodput: IJobJSON['goodput']) => job({ goodput });

  test('the bar and the line of a job with a restart', () => {
    const view = goodputView(
      withGoodput({
        goodput: 0.5,
        wall: 10,
        steps: 20,
        lost_steps: 3,
        seconds: { productive: 5, checkpoint: 0, lost: 4, startup: 1, hung: 0, queued: 0, paused: 0 }
      })
    );
    assert.deepEqual(
      view?.segments.map(s => [s.bucket, s.percent]),
      [
        ['productive', 50],
        ['lost', 40],
        ['startup', 10]
      ]
    );
    assert.equal(view?.text, 'goodput 50% of 10.0 s · lost 4.0 s (3 steps) · start-up and exit 1.0 s');
  });

  test('nothing before the job started; unmeasured without ctx.loop steps', () => {
    assert.equal(goodputView(withGoodput(null)), null);
    const view = goodputView(
      withGoodput({
        goodput: null,
        wall: 2,
        steps: 0,
        lost_steps: 0,
        seconds: { productive: 0, checkpoint: 0, lost: 0, startup: 2, hung: 0, queued: 0, paused: 0 }
      })
    );
    assert.equal(view?.text, 'goodput unmeasured (no ctx.loop steps) of 2.0 s · start-up and exit 2.0 s');
  });
});
