/**
 * What the panel shows of a job, computed from the REST API's JSON: which actions its
 * state allows (and why not), its progress, its events, the attach code. Pure
 * functions, no DOM, no JupyterLab import, so that they are unit-tested in Node
 * (test/models.test.ts). The JSON types, the cluster views and the formatting
 * helpers are re-exported from here.
 */

import { formatDuration, formatNumber, plural } from './format';
import { Action, ACTIONS, IJobJSON } from './types';

export * from './clusters';
export * from './format';
export * from './types';

// status and actions ---------------------------------------------------------------------

export const STATUS_COLORS: Record<string, string> = {
  QUEUED: '#6b7280',
  STARTING: '#2563eb',
  RUNNING: '#16a34a',
  PAUSED: '#d97706',
  HUNG: '#b91c1c',
  HELD: '#c2410c',
  RESTARTING: '#db2777',
  SUSPENDING: '#7c3aed',
  SUSPENDED: '#7c3aed',
  STOPPING: '#ea580c',
  FINISHED: '#0f766e',
  FAILED: '#dc2626',
  STOPPED: '#4b5563'
};

const TERMINAL = new Set(['FINISHED', 'FAILED', 'STOPPED']);

export function isTerminal(status: string): boolean {
  return TERMINAL.has(status);
}

/** From which states each action is allowed (as the control plane decides). */
const ALLOWED: Record<Action, string[]> = {
  // QUEUED and STARTING: taken at the job's first step boundary
  pause: ['QUEUED', 'STARTING', 'RUNNING'],
  resume: ['PAUSED', 'SUSPENDED'],
  checkpoint: ['QUEUED', 'STARTING', 'RUNNING', 'PAUSED'],
  suspend: ['QUEUED', 'STARTING', 'RUNNING', 'PAUSED'],
  stop: [
    'QUEUED',
    'STARTING',
    'RUNNING',
    'PAUSED',
    'HUNG',
    'HELD',
    'RESTARTING',
    'SUSPENDING',
    'SUSPENDED'
  ]
};

export interface IActionState {
  enabled: boolean;
  /** Why it is disabled (empty when enabled): the button's tooltip. */
  reason: string;
}

/**
 * Which buttons a job's state allows (and whether this user may change it at all),
 * and why the others are greyed out.
 */
export function actionStates(job: IJobJSON): Record<Action, IActionState> {
  const out = {} as Record<Action, IActionState>;
  const status = String(job.status);
  const hasDir = Boolean(job.spec && job.spec['checkpoint_dir']);
  // a script job (launch_script): what its ranks accept; stop and suspend are signals
  const controls = Array.isArray(job.controls) ? job.controls : null;
  for (const action of ACTIONS) {
    let reason = '';
    if (job.may_change === false) {
      // not this user's job: the control plane would refuse it (403), whatever its state
      reason = job.refusal || `Job ${job.name} belongs to ${job.owner ?? 'someone else'}`;
    } else if (!ALLOWED[action].includes(status)) {
      reason = isTerminal(status)
        ? `Job ${job.name} is ${status}: nothing more to ${action}`
        : `Job ${job.name} is ${status}; only a ${joinOr(ALLOWED[action])} job can ${action}`;
    } else if (controls !== null && (action === 'pause' || action === 'checkpoint')) {
      if (!controls.includes(action)) {
        reason =
          `Job ${job.name} runs a script that does not accept ${action} requests ` +
          '(it calls no clustersdk.script.step' +
          (action === 'checkpoint' ? ' with saves=True' : '') +
          ', nor uses ClusterSDKCallback)';
      } else if (action === 'checkpoint' && status === 'PAUSED') {
        reason = `Job ${job.name} runs a script, which saves while it runs: resume it first`;
      }
    } else if ((action === 'checkpoint' || action === 'suspend') && !hasDir && controls === null) {
      reason = `Job ${job.name} was launched without checkpoint_dir, so it cannot ${action}`;
    }
    out[action] = { enabled: reason === '', reason };
  }
  return out;
}

function joinOr(words: string[]): string {
  return words.length <= 2
    ? words.join(' or ')
    : `${words.slice(0, -1).join(', ')} or ${words[words.length - 1]}`;
}

/** What a successful action did, for its notification. */
export function actionDone(action: Action, job: IJobJSON): string {
  switch (action) {
    case 'pause':
      return `Paused job ${job.name} before step ${job.paused_at ?? '?'}`;
    case 'resume':
      return `Job ${job.name} is ${job.status}`;
    case 'checkpoint':
      return `Checkpointed job ${job.name}: ${job.checkpoint ?? ''}`;
    case 'suspend':
      return `Suspended job ${job.name}: its slots are free`;
    case 'stop':
      return `Job ${job.name} is ${job.status}`;
  }
}

/** The notification for a refused or failed action: names the job, the status and why. */
export function actionFailed(
  action: Action,
  job: string,
  status: number,
  message: string
): string {
  const what = status ? ` (HTTP ${status})` : '';
  return `Could not ${action} job ${job}${what}: ${message}`;
}

// progress -----------------------------------------------------------------------------------

export interface IProgressView {
  done: number;
  total: number | null;
  /** 0..1, or null when the total is unknown. */
  fraction: number | null;
  /** "step 41 / 1000" */
  stepText: string;
  /** "12.3 steps/s", empty when not moving. */
  rateText: string;
  /** "ETA 1m 20s", empty when unknown. */
  etaText: string;
}

/** Progress bar text: steps done (the furthest rank), the total, steps/s and ETA. */
export function progressView(job: IJobJSON): IProgressView {
  const step = job.progress?.step;
  const done = step === null || step === undefined ? 0 : step + 1;
  const total = positive(job.total_steps ?? job.spec?.['total_steps']);
  const rate = job.status === 'RUNNING' ? job.progress?.steps_per_second ?? 0 : 0;
  const fraction = total ? Math.min(done / total, 1) : null;
  let etaText = '';
  if (total && rate > 0 && done < total) {
    etaText = `ETA ${formatDuration((total - done) / rate)}`;
  }
  return {
    done,
    total,
    fraction: job.status === 'FINISHED' && total ? 1 : fraction,
    stepText: total ? `step ${done} / ${total}` : `step ${done}`,
    rateText: rate > 0 ? `${formatNumber(rate)} steps/s` : '',
    etaText
  };
}

/** Each goodput bucket: how it reads and its colour (as clustersdk.control.goodput and
 *  the notebook dashboard have them). */
export const GOODPUT_BUCKETS: [string, string, string][] = [
  ['productive', 'steps that stand', '#16a34a'],
  ['checkpoint', 'checkpoint stalls', '#2563eb'],
  ['lost', 'lost', '#dc2626'],
  ['startup', 'start-up and exit', '#9ca3af'],
  ['hung', 'hung', '#f59e0b'],
  ['queued', 'queued again', '#a78bfa'],
  ['paused', 'paused', '#fcd34d']
];

export interface IGoodputView {
  segments: { bucket: string; label: string; color: string; percent: number; seconds: number }[];
  text: string;
}

/** The goodput bar's segments and its line ("goodput 73% of 6.6 s · lost 0.9 s (8 steps)
 *  · ..."), or null before the job started. */
export function goodputView(job: IJobJSON): IGoodputView | null {
  const g = job.goodput;
  if (!g || !(g.wall > 0)) {
    return null;
  }
  const seconds = (s: number) => (s < 100 ? `${s.toFixed(1)} s` : formatDuration(s));
  const segments = GOODPUT_BUCKETS.filter(([bucket]) => (g.seconds[bucket] ?? 0) > 0).map(
    ([bucket, label, color]) => ({
      bucket,
      label,
      color,
      seconds: g.seconds[bucket],
      percent: (100 * g.seconds[bucket]) / g.wall
    })
  );
  const head =
    g.goodput === null ? 'goodput unmeasured (no ctx.loop steps)' : `goodput ${Math.round(g.goodput * 100)}%`;
  const rest = segments
    .filter(s => s.bucket !== 'productive' && s.seconds >= 0.05)
    .sort((a, b) => b.seconds - a.seconds)
    .map(
      s =>
        `${s.label} ${seconds(s.seconds)}` +
        (s.bucket === 'lost' && g.lost_steps ? ` (${g.lost_steps} steps)` : '')
    );
  return { segments, text: [`${head} of ${seconds(g.wall)}`, ...rest].join(' · ') };
}

function positive(value: unknown): number | null {
  return typeof value === 'number' && Number.isFinite(value) && value > 0
    ? value
    : null;
}

// jobs ------------------------------------------------------------------------------------------

/** Live jobs first (newest first), then the ended ones (newest first). */
export function sortJobs(jobs: IJobJSON[]): { live: IJobJSON[]; ended: IJobJSON[] } {
  const newest = (a: IJobJSON, b: IJobJSON) =>
    (b.submitted ?? 0) - (a.submitted ?? 0);
  return {
    live: jobs.filter(j => !isTerminal(String(j.status))).sort(newest),
    ended: jobs.filter(j => isTerminal(String(j.status))).sort(newest)
  };
}

/** The job's one-line description: "alice · ddp · 4 ranks". */
export function jobMeta(job: IJobJSON): string {
  const ranks = job.world_size ?? '?';
  return [
    job.owner || 'unknown owner',
    job.kind === 'script' ? `script ${String(job.spec?.['fn'] ?? '?')}` : job.strategy ?? '?',
    `${ranks} rank${ranks === 1 ? '' : 's'}`
  ].join(' · ');
}

/** What the notebook button inserts: reach the same job from a kernel. */
export function attachCode(address: string, name: string): string {
  return (
    'import clustersdk as cs\n\n' +
    `job = cs.Job.attach(cs.Cluster.connect(${pyString(address)}), ${pyString(name)})`
  );
}

function pyString(text: string): string {
  return JSON.stringify(text); // a JSON string is a valid Python string literal
}

export interface IEventView {
  time: number | null;
  kind: string;
  text: string;
}

/**
 * The job's events, oldest first: what its record tells (submitted, started, paused,
 * checkpoint, end) and, where the API gives them, its durable `events` (restarts with
 * the worker that was lost, failures, world-size changes, preemptions, hangs).
 */
export function jobEvents(job: IJobJSON): IEventView[] {
  const durable: IEventView[] = Array.isArray(job.events)
    ? job.events.map(e => ({
        time: typeof e.time === 'number' ? e.time : null,
        kind: String(e.kind ?? 'event'),
        text: String(e.message ?? e.kind ?? '')
      }))
    : [];
  const events: IEventView[] = [
    { time: job.submitted, kind: 'submitted', text: `submitted by ${job.owner || 'unknown'}` }
  ];
  if (job.started) {
    events.push({
      time: job.started,
      kind: 'started',
      text: `started on ${plural(job.ranks.length, 'rank')}`
    });
  }
  events.push(...durable);
  if (job.restarts && !durable.some(e => e.kind === 'restarted')) {
    const budget = job.spec?.['max_restarts'];
    events.push({
      time: null,
      kind: 'restarted',
      text: `restarted ${job.restarts} time(s)` + (budget ? ` of ${budget}` : '') +
        ' after a lost worker'
    });
  }
  if (job.checkpoint) {
    const step = job.checkpoint_step ?? '?';
    events.push({ time: null, kind: 'checkpoint', text: `checkpoint at step ${step}: ${job.checkpoint}` });
  }
  if (job.checkpoint_error) {
    events.push({ time: null, kind: 'checkpoint failed', text: job.checkpoint_error });
  }
  if (job.status === 'PAUSED' && job.paused_at !== null && job.paused_at !== undefined) {
    events.push({ time: null, kind: 'paused', text: `paused before step ${job.paused_at}` });
  }
  if (job.reason) {
    events.push({ time: null, kind: String(job.status).toLowerCase(), text: job.reason });
  }
  if (job.error && !durable.some(e => e.kind === 'failed')) {
    const e = job.error;
    events.push({
      time: job.ended ?? null,
      kind: 'failed',
      text: `rank ${e.rank ?? '?'}: ${e.type ?? 'error'}: ${e.message ?? ''}`
    });
  } else if (job.ended && !job.error) {
    events.push({ time: job.ended, kind: String(job.status).toLowerCase(), text: `ended ${job.status}` });
  }
  return events;
}
