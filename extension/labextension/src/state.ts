/**
 * The panel's live state: the newest overview (every cluster and job, one request
 * per refresh), which job is selected, and the actions the buttons and commands run.
 *
 * The overview is refreshed every `interval` ms while someone looks at it (the
 * sidebar, or the status bar's numbers through the cheaper cluster list every
 * STATUS_EVERY ms when the sidebar is hidden), and not at all while the browser
 * tab is hidden.
 */

import { Notification } from '@jupyterlab/apputils';
import { Poll } from '@lumino/polling';
import { ISignal, Signal } from '@lumino/signaling';

import { ApiError, postAction, requestAPI } from './api';
import {
  Action,
  actionDone,
  actionFailed,
  IClusterJSON,
  IJobJSON,
  IOverviewJSON
} from './models';

export const DEFAULT_INTERVAL = 750;
/** How often the status bar's numbers refresh while the sidebar is hidden. */
export const STATUS_EVERY = 5000;

export class PanelState {
  overview: IOverviewJSON | null = null;
  /** Clusters for the status bar: from the overview, or the light list. */
  clusters: IClusterJSON[] = [];
  error: string | null = null;
  selected: string | null = null;
  /** Jobs with an action under way (their buttons wait). */
  readonly busy = new Set<string>();
  /** The name of every job seen, by id: a notification names a job that vanished. */
  readonly names = new Map<string, string>();

  constructor() {
    this.overviewPoll = new Poll({
      auto: false,
      factory: () => this.fetchOverview(),
      frequency: { interval: this._interval, backoff: true, max: 30_000 },
      standby: () => !this._watching || 'when-hidden',
      name: 'clustersdk:overview'
    });
    this.statusPoll = new Poll({
      auto: false,
      factory: () => this.fetchClusters(),
      frequency: { interval: STATUS_EVERY, backoff: true, max: 60_000 },
      standby: () => this._watching || 'when-hidden',
      name: 'clustersdk:status'
    });
  }

  /** Fires after every refresh and every change of selection. */
  get changed(): ISignal<PanelState, void> {
    return this._changed;
  }

  /** Refresh period of the sidebar, in ms (the settings' refreshInterval). */
  set interval(ms: number) {
    this._interval = ms;
    this.overviewPoll.frequency = { interval: ms, backoff: true, max: 30_000 };
  }

  /** Whether the sidebar is shown: only then does the overview poll run. */
  set watching(on: boolean) {
    if (on === this._watching) {
      return;
    }
    this._watching = on;
    if (on) {
      void this.refresh();
    } else {
      void this.statusPoll.refresh();
    }
  }

  get watching(): boolean {
    return this._watching;
  }

  start(): void {
    void this.overviewPoll.start();
    void this.statusPoll.start();
  }

  /** Read the overview now (and again every interval). */
  async refresh(): Promise<void> {
    await this.overviewPoll.refresh();
    await this.overviewPoll.tick;
  }

  job(ref: string | null): IJobJSON | null {
    if (!ref || !this.overview) {
      return null;
    }
    const jobs = this.overview.jobs;
    return (
      jobs.find(j => j.id === ref) ??
      [...jobs].reverse().find(j => j.name === ref) ?? // the newest of that name
      null
    );
  }

  cluster(id: string): IClusterJSON | null {
    return this.overview?.clusters.find(c => c.id === id) ?? null;
  }

  select(job: string | null): void {
    this.selected = job;
    this._changed.emit();
  }

  /**
   * Run an action on a job and say how it went in a notification: the new state on
   * success, the API's reason (a 409 for a job whose state forbids it, a 404 for a job
   * that vanished) on failure. Never silent.
   */
  async act(ref: string, action: Action, body?: object): Promise<IJobJSON | null> {
    const known = this.job(ref);
    const name = known?.name ?? this.names.get(ref) ?? ref;
    const id = known?.id ?? ref;
    this.busy.add(id);
    this._changed.emit();
    try {
      const record = await postAction<IJobJSON>(id, action, body);
      Notification.success(actionDone(action, record), { autoClose: 4000 });
      return record;
    } catch (error) {
      const e = error instanceof ApiError ? error : new ApiError(0, 'error', String(error));
      Notification.error(actionFailed(action, name, e.status, e.message), { autoClose: 10000 });
      return null;
    } finally {
      this.busy.delete(id);
      void this.refresh();
    }
  }

  dispose(): void {
    this.overviewPoll.dispose();
    this.statusPoll.dispose();
  }

  private async fetchOverview(): Promise<void> {
    try {
      this.overview = await requestAPI<IOverviewJSON>('overview');
      this.clusters = this.overview.clusters;
      this.overview.jobs.forEach(j => this.names.set(j.id, j.name));
      this.error = null;
    } catch (error) {
      this.error = error instanceof Error ? error.message : String(error);
      throw error; // the poll backs off
    } finally {
      this._changed.emit();
    }
  }

  private async fetchClusters(): Promise<void> {
    const answer = await requestAPI<{ clusters: IClusterJSON[] }>('clusters');
    this.clusters = answer.clusters;
    this._changed.emit();
  }

  private overviewPoll: Poll;
  private statusPoll: Poll;
  private _interval = DEFAULT_INTERVAL;
  private _watching = false;
  private _changed = new Signal<PanelState, void>(this);
}
