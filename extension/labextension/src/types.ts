/**
 * The REST API's JSON, as the server extension's openapi.yaml describes it.
 */

export type Status =
  | 'QUEUED'
  | 'STARTING'
  | 'RUNNING'
  | 'PAUSED'
  | 'HUNG'
  | 'HELD'
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
  /** The CPU cores its worker runs on ("0-3,8"); "" or absent: not bound. */
  cpus?: string;
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
  /** a standing cluster's processes started again by their supervisor */
  restarts?: { count: number; recent: { time: number; message: string }[] };
  /** the URL of its Dask dashboard; null: its scheduler serves none */
  dashboard_link?: string | null;
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

/** Where a job's wall time went (clustersdk.control.goodput): seconds per bucket, adding up to wall. */
export interface IGoodputJSON {
  goodput: number | null;
  wall: number;
  seconds: Record<string, number>;
  steps: number;
  lost_steps: number;
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
  /** "script" for a script job (launch_script: spec.fn is what it runs), else "function". */
  kind?: 'script' | 'function';
  owner?: string | null;
  /** Whether the Jupyter user may change it (its owner or an admin); false greys out
   *  every button, with ``refusal`` as the tooltip. Absent: no identities (plain tcp). */
  may_change?: boolean;
  refusal?: string;
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
  goodput?: IGoodputJSON | null;
  /** A script job's: what its ranks accept ("stop", "suspend", and "pause", "checkpoint"
   * when the script opted in); absent for a function job (which accepts everything). */
  controls?: string[] | null;
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
