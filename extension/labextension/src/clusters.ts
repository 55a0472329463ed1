/**
 * What the sidebar shows of a cluster: its slots by host, with telemetry bars, and the
 * status bar's line. Pure: unit-tested in Node (test/models.test.ts).
 */

import { plural } from './format';
import { IClusterJSON, IJobJSON, ISlotJSON } from './types';

export interface IBar {
  label: string;
  /** 0..1, or null: no reading yet. */
  fraction: number | null;
  text: string;
}

export interface ISlotView {
  key: string;
  label: string;
  /** The CPU cores its worker is bound to ("cores 0-3"), or null when not bound. */
  cores: string | null;
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
  /** "2 restarts of its processes" and the newest of them; null: none */
  restarts: { text: string; detail: string } | null;
  /** the URL of its Dask dashboard; null: it serves none (or an older server) */
  dashboard: string | null;
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
    cores: coresText(slot.cpus),
    cpu,
    busy: Boolean(slot.job),
    job: slot.job,
    jobName: slot.job ? jobNames.get(slot.job) ?? slot.job : null,
    bars
  };
}

/** "core 3" or "cores 0-3,8" for a worker's CPU list; null when it is not bound. */
export function coresText(cpus: string | undefined): string | null {
  if (!cpus) {
    return null;
  }
  return `${/[-,]/.test(cpus) ? 'cores' : 'core'} ${cpus}`;
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
    hosts: [...hosts].map(([host, list]) => ({ host, slots: list })),
    restarts: restartsView(cluster),
    dashboard: cluster.dashboard_link ?? null
  };
}

/** A standing cluster's restarts of its scheduler or workers, newest last. */
function restartsView(cluster: IClusterJSON): IClusterView['restarts'] {
  const restarts = cluster.restarts;
  if (!restarts || restarts.count === 0) {
    return null;
  }
  const newest = restarts.recent[restarts.recent.length - 1];
  return {
    text:
      `${plural(restarts.count, 'restart')} of its processes` +
      (newest ? `, the last ${new Date(newest.time * 1000).toLocaleString()}` : ''),
    detail: restarts.recent.map(r => r.message).join('\n')
  };
}

/** How the server knows the cluster: started here, connected to, or configured. */
const KINDS: Record<string, string> = {
  local: 'local',
  connect: 'connected',
  remote: 'configured'
};


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
