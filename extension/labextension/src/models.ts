/**
 * What the panel shows, computed from the REST API's JSON: pure functions, no DOM,
 * no JupyterLab import, so that they are unit-tested in Node (test/models.test.ts).
 *
 * The JSON shapes are those of the server extension's openapi.yaml.
 */

export type Status =
  | 'QUEUED'
  | 'STARTING'
  | 'RUNNING'
  | 'PAUSED'
  | 'RESTARTING'
  | 'SUSPENDING'
  | 'SUSPENDED'
  | 'STOPPING'
  | 'FINISHED'
  | 'FAILED'
  | 'STOPPED';

export const ACTIONS = [
  'pause',
  'resume',
  'checkpoint',
  'suspend',
  'stop'
] as const;
export type Action = (typeof ACTIONS)[number];

export interface ITelemetry {
  source?: 'nvml' | 'psutil';
  time?: number;
  gpu_util?: number;
  gpu_mem_used?: number;
  gpu_mem_total?: number;
  cpu_percent?: number;
  rss?: number;
  mem_used?: number;
  mem_total?: number;
  [key: string]: unknown;
}

export interface ISlotJSON {
  worker: string;
  host: string;
  kind: 'cuda' | 'cpu' | string;
  index: number | null;
  job: string | null;
  telemetry: ITelemetry | null;
}

export interface IClusterJSON {
  id: string;
  address: string;
  kind: string;
  source: string;
  reachable: boolean;
  error: string | null;
  workers?: number;
  hosts?: number;
  gpus?: number;
  utilisation?: { slots: number; busy: number };
  jobs?: Partial<Record<Status, number>>;
  slots?: ISlotJSON[];
}

export interface IProgressJSON {
  step: number | null;
  steps_per_second: number;
  scalars: Record<string, number>;
}

export interface IJobError {
  rank?: number | null;
  type?: string;
  message?: string;
  traceback?: string;
}

export interface IJobEventJSON {
  time?: number | null;
  kind?: string;
  message?: string;
  [key: string]: unknown;
}

export interface IJobJSON {
  id: string;
  name: string;
  cluster: string;
  status: Status | string;
  terminal: boolean;
  reason: string;
  world_size: number | null;
  strategy: string | null;
  owner?: string | null;
  submitted: number;
  started?: number | null;
  ended?: number | null;
  ranks: { rank: number; worker: string; host: string; device: string }[];
  error?: IJobError | null;
  spec: Record<string, unknown>;
  paused_at?: number | null;
  checkpoint?: string | null;
  checkpoint_step?: number | null;
  checkpoint_error?: string | null;
  restarts?: number | null;
  total_steps?: number | null;
  progress?: IProgressJSON | null;
  events?: IJobEventJSON[];
}

export interface IOverviewJSON {
  time: number;
  clusters: IClusterJSON[];
  jobs: IJobJSON[];
  unreachable: string[];
}

export interface IHistoryRow {
  seq: number;
  rank: number;
  step: number;
  time: number;
  [scalar: string]: number | null;
}

export interface ILogLine {
  seq: number;
  rank: number;
  time: number;
  stream: string;
  text: string;
}

export interface ICheckpointsJSON {
  job: string;
  directory: string | null;
  readable: boolean;
  error: string | null;
  newest: string | null;
  checkpoints: {
    step: number;
    path: string;
    bytes: number;
    time: number;
    world_size: number | null;
    newest: boolean;
  }[];
}

// status and actions ---------------------------------------------------------------------

export const STATUS_COLORS: Record<string, string> = {
  QUEUED: '#6b7280',
  STARTING: '#2563eb',
  RUNNING: '#16a34a',
  PAUSED: '#d97706',
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
  pause: ['RUNNING'],
  resume: ['PAUSED', 'SUSPENDED'],
  checkpoint: ['RUNNING', 'PAUSED'],
  suspend: ['RUNNING', 'PAUSED'],
  stop: [
    'QUEUED',
    'STARTING',
    'RUNNING',
    'PAUSED',
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
 * Which buttons a job's state allows, and why the others are greyed out.
 */
export function actionStates(job: IJobJSON): Record<Action, IActionState> {
  const out = {} as Record<Action, IActionState>;
  const status = String(job.status);
  const hasDir = Boolean(job.spec && job.spec['checkpoint_dir']);
  for (const action of ACTIONS) {
    let reason = '';
    if (!ALLOWED[action].includes(status)) {
      reason = isTerminal(status)
        ? `Job ${job.name} is ${status}: nothing more to ${action}`
        : `Job ${job.name} is ${status}; only a ${joinOr(ALLOWED[action])} job can ${action}`;
    } else if ((action === 'checkpoint' || action === 'suspend') && !hasDir) {
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

function positive(value: unknown): number | null {
  return typeof value === 'number' && Number.isFinite(value) && value > 0
    ? value
    : null;
}

/** 45 -> "45s", 80 -> "1m 20s", 7300 -> "2h 1m". */
export function formatDuration(seconds: number): string {
  if (!Number.isFinite(seconds) || seconds < 0) {
    return '?';
  }
  const s = Math.round(seconds);
  if (s < 60) {
    return `${s}s`;
  }
  if (s < 3600) {
    return `${Math.floor(s / 60)}m ${s % 60}s`;
  }
  if (s < 86400) {
    return `${Math.floor(s / 3600)}h ${Math.floor((s % 3600) / 60)}m`;
  }
  return `${Math.floor(s / 86400)}d ${Math.floor((s % 86400) / 3600)}h`;
}

/** 3 significant digits, without exponent for everyday sizes. */
export function formatNumber(value: number): string {
  if (!Number.isFinite(value)) {
    return '-';
  }
  const abs = Math.abs(value);
  if (abs !== 0 && (abs < 1e-3 || abs >= 1e6)) {
    return value.toExponential(2);
  }
  return String(Number(value.toPrecision(3)));
}

/** 1536 -> "1.5 KiB". */
export function formatBytes(bytes: number): string {
  const units = ['B', 'KiB', 'MiB', 'GiB', 'TiB'];
  let value = bytes;
  let unit = 0;
  while (value >= 1024 && unit < units.length - 1) {
    value /= 1024;
    unit += 1;
  }
  return unit === 0 ? `${value} B` : `${value.toFixed(1)} ${units[unit]}`;
}

// clusters and slots -------------------------------------------------------------------------

export interface IBar {
  label: string;
  /** 0..1, or null: no reading yet. */
  fraction: number | null;
  text: string;
}

export interface ISlotView {
  key: string;
  label: string;
  cpu: boolean;
  busy: boolean;
  job: string | null;
  jobName: string | null;
  bars: IBar[];
}

export interface IHostView {
  host: string;
  slots: ISlotView[];
}

export interface IClusterView {
  id: string;
  address: string;
  title: string;
  reachable: boolean;
  error: string | null;
  summary: string;
  hosts: IHostView[];
}

const GIB = 1024 ** 3;

/**
 * One slot: "GPU 0" with utilisation and memory bars, or "CPU slot 1" with the
 * host's CPU and the rank's memory (labelled, since those are not GPU readings).
 */
export function slotView(
  slot: ISlotJSON,
  jobNames: Map<string, string>,
  ordinal: number
): ISlotView {
  const cpu = slot.kind !== 'cuda';
  const t = slot.telemetry ?? {};
  const bars: IBar[] = [];
  if (!cpu) {
    bars.push(percentBar('util', t.gpu_util));
    bars.push(memoryBar('mem', t.gpu_mem_used, t.gpu_mem_total));
  } else if (slot.job) {
    bars.push(percentBar('host CPU', t.cpu_percent));
    bars.push(memoryBar('rank mem', t.rss, t.mem_total));
  }
  const index = slot.index ?? ordinal;
  return {
    key: `${slot.worker}/${slot.index ?? ordinal}`,
    label: cpu ? `CPU slot ${ordinal}` : `GPU ${index}`,
    cpu,
    busy: Boolean(slot.job),
    job: slot.job,
    jobName: slot.job ? jobNames.get(slot.job) ?? slot.job : null,
    bars
  };
}

function percentBar(label: string, value: unknown): IBar {
  if (typeof value !== 'number' || !Number.isFinite(value)) {
    return { label, fraction: null, text: '–' };
  }
  const clamped = Math.max(0, Math.min(value, 100));
  return { label, fraction: clamped / 100, text: `${Math.round(value)}%` };
}

function memoryBar(label: string, used: unknown, total: unknown): IBar {
  if (typeof used !== 'number' || !Number.isFinite(used)) {
    return { label, fraction: null, text: '–' };
  }
  const gib = (used / GIB).toFixed(1);
  if (typeof total === 'number' && total > 0) {
    return {
      label,
      fraction: Math.min(used / total, 1),
      text: `${gib} / ${(total / GIB).toFixed(1)} GiB`
    };
  }
  return { label, fraction: null, text: `${gib} GiB` };
}

/** A cluster with its slots grouped by host, in the order the scheduler ranks them. */
export function clusterView(
  cluster: IClusterJSON,
  jobs: IJobJSON[]
): IClusterView {
  const names = new Map(jobs.map(j => [j.id, j.name]));
  const hosts = new Map<string, ISlotView[]>();
  (cluster.slots ?? []).forEach((slot, i) => {
    const list = hosts.get(slot.host) ?? [];
    list.push(slotView(slot, names, i));
    hosts.set(slot.host, list);
  });
  const slots = cluster.slots ?? [];
  const busy = slots.filter(s => s.job).length;
  const gpus = slots.filter(s => s.kind === 'cuda').length;
  const unit = gpus === slots.length && gpus > 0 ? 'GPUs' : 'slots';
  const kind = KINDS[cluster.kind] ?? cluster.kind;
  const summary = cluster.reachable
    ? `${kind} · ${plural(hosts.size, 'host')} · ${busy}/${slots.length} ${unit} busy` +
      (gpus === 0 && slots.length ? ' · CPU only' : '')
    : `${kind} · unreachable`;
  return {
    id: cluster.id,
    address: cluster.address,
    title: cluster.address,
    reachable: cluster.reachable,
    error: cluster.error,
    summary,
    hosts: [...hosts].map(([host, list]) => ({ host, slots: list }))
  };
}

/** How the server knows the cluster: started here, connected to, or configured. */
const KINDS: Record<string, string> = {
  local: 'local',
  connect: 'connected',
  remote: 'configured'
};

function plural(n: number, word: string): string {
  return `${n} ${word}${n === 1 ? '' : 's'}`;
}

/**
 * The status bar's line: "clustersdk: 2 running · 6/8 GPUs busy" ("slots" where
 * some slots are CPUs).
 */
export function statusText(clusters: IClusterJSON[]): string {
  let running = 0;
  let busy = 0;
  let slots = 0;
  let gpus = 0;
  for (const cluster of clusters) {
    if (!cluster.reachable) {
      continue;
    }
    running += cluster.jobs?.RUNNING ?? 0;
    busy += cluster.utilisation?.busy ?? 0;
    slots += cluster.utilisation?.slots ?? 0;
    gpus += cluster.gpus ?? 0;
  }
  const unit = slots > 0 && gpus === slots ? 'GPUs' : 'slots';
  return `clustersdk: ${running} running · ${busy}/${slots} ${unit} busy`;
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
    job.strategy ?? '?',
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
 * The job's events, oldest first: from its `events` array when the API gives one,
 * else what its record tells (submitted, started, paused, checkpoint, restarts, end).
 */
export function jobEvents(job: IJobJSON): IEventView[] {
  if (Array.isArray(job.events)) {
    return job.events.map(e => ({
      time: typeof e.time === 'number' ? e.time : null,
      kind: String(e.kind ?? 'event'),
      text: String(e.message ?? e.kind ?? '')
    }));
  }
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
  if (job.restarts) {
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
  if (job.error) {
    const e = job.error;
    events.push({
      time: job.ended ?? null,
      kind: 'failed',
      text: `rank ${e.rank ?? '?'}: ${e.type ?? 'error'}: ${e.message ?? ''}`
    });
  } else if (job.ended) {
    events.push({ time: job.ended, kind: String(job.status).toLowerCase(), text: `ended ${job.status}` });
  }
  return events;
}
