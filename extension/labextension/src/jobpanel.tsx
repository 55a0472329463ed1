/**
 * A job's panel in the main area: live loss (or any logged scalar) and throughput
 * charts per rank, each rank's logs with a rank selector, the job's checkpoints and
 * its events. It reads incrementally (history and logs since a cursor) while it is
 * visible, and stops once the job has ended and everything is read.
 */

import { ReactWidget } from '@jupyterlab/ui-components';
import { Message } from '@lumino/messaging';
import { Poll } from '@lumino/polling';
import * as React from 'react';

import { requestAPI } from './api';
import { RankChart } from './chart';
import { ActionButtons, Badge, clock, GoodputBar, ProgressBar } from './components';
import {
  Action,
  formatBytes,
  ICheckpointsJSON,
  IHistoryRow,
  IJobJSON,
  ILogLine,
  isTerminal,
  jobEvents,
  jobMeta
} from './models';
import { RunSeries } from './series';
import { PanelState } from './state';

const MAX_LOG_LINES = 2000;
const HISTORY_PAGE = 5000;

export class JobPanel extends ReactWidget {
  constructor(
    readonly jobId: string,
    private readonly state: PanelState,
    private readonly insertCode: (job: IJobJSON) => void,
    interval: number
  ) {
    super();
    this.addClass('jp-clustersdk-jobpanel');
    this.record = state.job(jobId);
    this.title.label = this.record ? `Job ${this.record.name}` : `Job ${jobId}`;
    this.poll = new Poll({
      auto: false,
      factory: () => this.read(),
      frequency: { interval, backoff: true, max: 30_000 },
      standby: () => !this.isVisible || 'when-hidden',
      name: `clustersdk:job:${jobId}`
    });
    state.changed.connect(this.onState, this);
  }

  set interval(ms: number) {
    this.poll.frequency = { interval: ms, backoff: true, max: 30_000 };
  }

  dispose(): void {
    this.poll.dispose();
    this.state.changed.disconnect(this.onState, this);
    super.dispose();
  }

  protected onAfterAttach(msg: Message): void {
    super.onAfterAttach(msg);
    void this.poll.start();
  }

  protected onAfterShow(msg: Message): void {
    super.onAfterShow(msg);
    this.state.select(this.jobId);
    void this.poll.refresh();
  }

  private onState(): void {
    // the sidebar's refresh may know of a new status first; the busy buttons change too
    const fresh = this.state.job(this.jobId);
    if (fresh && (!this.record || fresh.status !== this.record.status)) {
      this.record = { ...fresh, progress: fresh.progress ?? this.record?.progress };
    }
    this.update();
  }

  /** One refresh: the record, new history rows, new log lines, and the checkpoints. */
  private async read(): Promise<void> {
    if (this.finished) {
      return;
    }
    try {
      const record = await requestAPI<IJobJSON>(`jobs/${encodeURIComponent(this.jobId)}`);
      const ended = isTerminal(String(record.status)); // read before the rows: none missed
      this.record = record;
      this.title.label = `Job ${record.name}`;
      await this.readHistory();
      await this.readLogs();
      if (this.checkpoints === null || this.checkpoints.newest !== record.checkpoint) {
        this.checkpoints = await requestAPI<ICheckpointsJSON>(
          `jobs/${encodeURIComponent(this.jobId)}/checkpoints`
        );
      }
      this.error = null;
      this.finished = ended;
    } catch (error) {
      this.error = error instanceof Error ? error.message : String(error);
      throw error;
    } finally {
      this.update();
    }
  }

  private async readHistory(): Promise<void> {
    for (;;) {
      const page = await requestAPI<{ rows: IHistoryRow[]; last: number; more: boolean }>(
        `jobs/${encodeURIComponent(this.jobId)}/history`,
        {},
        { since: this.series.last, limit: HISTORY_PAGE }
      );
      this.series.add(page.rows);
      this.series.last = page.last;
      if (!page.more) {
        return;
      }
    }
  }

  private async readLogs(): Promise<void> {
    const rank = this.rank;
    const answer = await requestAPI<{ lines: ILogLine[]; last: number }>(
      `jobs/${encodeURIComponent(this.jobId)}/logs`,
      {},
      { since: this.logCursor, rank: rank ?? undefined }
    );
    if (rank !== this.rank) {
      return; // the selector changed while this was in flight
    }
    this.logs = [...this.logs, ...answer.lines].slice(-MAX_LOG_LINES);
    this.logCursor = answer.last;
  }

  private selectRank(value: string): void {
    this.rank = value === 'all' ? null : Number(value);
    this.logs = [];
    this.logCursor = 0;
    this.finished = false;
    this.update();
    void this.poll.refresh();
  }

  protected render(): JSX.Element {
    const job = this.record;
    if (!job) {
      return <div className="jp-clustersdk-empty">{this.error ?? 'Loading…'}</div>;
    }
    const act = (action: Action) => void this.state.act(job.id, action).then(() => {
      this.finished = false;
      void this.poll.refresh();
    });
    const names = this.series.names();
    const metric = names.includes(this.metric) ? this.metric : names[0];
    const ranks = Array.from({ length: job.world_size ?? 0 }, (_, i) => i);
    return (
      <div className="jp-clustersdk-jobpanel-body" data-job={job.id}>
        <header className="jp-clustersdk-jobpanel-header">
          <h2>{job.name}</h2>
          <Badge status={String(job.status)} />
          <span className="jp-clustersdk-job-meta">
            {jobMeta(job)} · {this.state.cluster(job.cluster)?.address ?? job.cluster}
          </span>
        </header>
        {job.reason && <div className="jp-clustersdk-job-reason">{job.reason}</div>}
        {this.error && <div className="jp-clustersdk-error">{this.error}</div>}
        <ProgressBar job={job} />
        <GoodputBar job={job} />
        <div className="jp-clustersdk-job-tools">
          <ActionButtons job={job} busy={this.state.busy.has(job.id)} onAction={act} />
          <button className="jp-clustersdk-insert" onClick={() => this.insertCode(job)}>
            Insert attach code
          </button>
        </div>
        <div className="jp-clustersdk-charts">
          <div>
            {names.length > 1 && (
              <select
                className="jp-clustersdk-metric"
                value={metric}
                onChange={e => {
                  this.metric = e.target.value;
                  this.update();
                }}
              >
                {names.map(n => (
                  <option key={n}>{n}</option>
                ))}
              </select>
            )}
            <RankChart title={metric ?? 'loss'} byRank={metric ? this.series.scalars.get(metric) : undefined} />
          </div>
          <RankChart title="throughput" unit="steps/s" byRank={this.series.rate} />
        </div>
        <section className="jp-clustersdk-logs">
          <h3>
            Logs{' '}
            <select
              className="jp-clustersdk-rank"
              aria-label="rank"
              value={this.rank === null ? 'all' : String(this.rank)}
              onChange={e => this.selectRank(e.target.value)}
            >
              <option value="all">all ranks</option>
              {ranks.map(r => (
                <option key={r} value={String(r)}>
                  rank {r}
                </option>
              ))}
            </select>
          </h3>
          <pre className="jp-clustersdk-log">
            {this.logs
              .map(l => (this.rank === null ? `[${l.rank}] ${l.text}` : l.text))
              .join('\n')}
          </pre>
        </section>
        <section className="jp-clustersdk-checkpoints">
          <h3>Checkpoints</h3>
          <Checkpoints model={this.checkpoints} />
        </section>
        <section className="jp-clustersdk-events">
          <h3>Events</h3>
          <ul>
            {jobEvents(job).map((e, i) => (
              <li key={i} data-kind={e.kind}>
                <span className="jp-clustersdk-event-time">{clock(e.time)}</span>
                <span className="jp-clustersdk-event-kind">{e.kind}</span> {e.text}
              </li>
            ))}
          </ul>
        </section>
      </div>
    );
  }

  private record: IJobJSON | null;
  private series = new RunSeries();
  private logs: ILogLine[] = [];
  private logCursor = 0;
  private rank: number | null = null;
  private metric = 'loss';
  private checkpoints: ICheckpointsJSON | null = null;
  private error: string | null = null;
  private finished = false;
  private poll: Poll;
}

function Checkpoints(props: { model: ICheckpointsJSON | null }): JSX.Element {
  const m = props.model;
  if (!m) {
    return <div className="jp-clustersdk-empty">…</div>;
  }
  if (!m.directory) {
    return <div className="jp-clustersdk-empty">Launched without checkpoint_dir.</div>;
  }
  if (!m.readable) {
    return <div className="jp-clustersdk-error">{m.error}</div>;
  }
  if (m.checkpoints.length === 0) {
    return <div className="jp-clustersdk-empty">None yet in {m.directory}.</div>;
  }
  return (
    <table className="jp-clustersdk-table">
      <thead>
        <tr>
          <th>step</th>
          <th>size</th>
          <th>time</th>
          <th>ranks</th>
          <th>path</th>
        </tr>
      </thead>
      <tbody>
        {m.checkpoints.map(c => (
          <tr key={c.path} className={c.newest ? 'jp-mod-newest' : ''}>
            <td>{c.step}</td>
            <td>{formatBytes(c.bytes)}</td>
            <td>{clock(c.time)}</td>
            <td>{c.world_size ?? ''}</td>
            <td title={c.path}>{c.path}</td>
          </tr>
        ))}
      </tbody>
    </table>
  );
}
