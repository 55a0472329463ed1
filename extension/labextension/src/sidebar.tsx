/**
 * The "GPU clusters" sidebar: every cluster with its hosts and slots, every job with
 * its badge, owner, strategy, world size, progress and buttons. It renders the
 * shared PanelState, and tells it when it is shown, so that it refreshes only then.
 */

import { ReactWidget } from '@jupyterlab/ui-components';
import { Message } from '@lumino/messaging';
import * as React from 'react';

import { ActionButtons, Badge, Bars, ProgressBar } from './components';
import { Action, clusterView, IJobJSON, jobMeta, sortJobs } from './models';
import { PanelState } from './state';

export interface ISidebarCallbacks {
  openJob: (job: IJobJSON) => void;
  insertCode: (job: IJobJSON) => void;
}

export class ClustersSidebar extends ReactWidget {
  constructor(
    private readonly state: PanelState,
    private readonly callbacks: ISidebarCallbacks
  ) {
    super();
    this.id = 'clustersdk-sidebar';
    this.title.caption = 'GPU clusters';
    this.addClass('jp-clustersdk-sidebar');
    state.changed.connect(() => this.update(), this);
  }

  protected onAfterShow(msg: Message): void {
    super.onAfterShow(msg);
    this.state.watching = true;
    this.update();
  }

  protected onAfterHide(msg: Message): void {
    super.onAfterHide(msg);
    this.state.watching = false;
  }

  protected render(): JSX.Element {
    const { overview, error } = this.state;
    const act = (job: IJobJSON, action: Action) => void this.state.act(job.id, action);
    return (
      <div className="jp-clustersdk-sidebar-body">
        <header className="jp-clustersdk-header">
          <h2>GPU clusters</h2>
          <button
            className="jp-clustersdk-refresh"
            title="Refresh now"
            onClick={() => void this.state.refresh()}
          >
            Refresh
          </button>
        </header>
        {error && <div className="jp-clustersdk-error">{error}</div>}
        {!overview && !error && <div className="jp-clustersdk-empty">Loading…</div>}
        {overview && overview.clusters.length === 0 && (
          <div className="jp-clustersdk-empty">
            No cluster yet: start one with <code>cs.Cluster.local()</code> or{' '}
            <code>cs.Cluster.connect(address)</code>, or list schedulers in{' '}
            <code>c.ClusterSDKApp.scheduler_addresses</code>.
          </div>
        )}
        {overview?.clusters.map(cluster => {
          const jobs = overview.jobs.filter(j => j.cluster === cluster.id);
          return (
            <ClusterCard
              key={cluster.id}
              cluster={clusterView(cluster, jobs)}
              jobs={jobs}
              selected={this.state.selected}
              busy={this.state.busy}
              onAction={act}
              callbacks={this.callbacks}
              onSelect={job => this.state.select(job.id)}
            />
          );
        })}
      </div>
    );
  }
}

function ClusterCard(props: {
  cluster: ReturnType<typeof clusterView>;
  jobs: IJobJSON[];
  selected: string | null;
  busy: Set<string>;
  onAction: (job: IJobJSON, action: Action) => void;
  onSelect: (job: IJobJSON) => void;
  callbacks: ISidebarCallbacks;
}): JSX.Element {
  const { cluster } = props;
  const { live, ended } = sortJobs(props.jobs);
  const row = (job: IJobJSON) => (
    <JobRow
      key={job.id}
      job={job}
      selected={props.selected === job.id}
      busy={props.busy.has(job.id)}
      onAction={action => props.onAction(job, action)}
      onOpen={() => {
        props.onSelect(job);
        props.callbacks.openJob(job);
      }}
      onInsert={() => props.callbacks.insertCode(job)}
    />
  );
  return (
    <section className="jp-clustersdk-cluster" data-cluster={cluster.id}>
      <div className="jp-clustersdk-cluster-title" title={cluster.address}>
        <span className="jp-clustersdk-cluster-address">{cluster.title}</span>
        <span className="jp-clustersdk-cluster-summary">{cluster.summary}</span>
        {cluster.dashboard && (
          <a
            className="jp-clustersdk-cluster-dashboard"
            href={cluster.dashboard}
            target="_blank"
            rel="noopener noreferrer"
            title="Dask's dashboard of this cluster"
          >
            Dask dashboard
          </a>
        )}
      </div>
      {!cluster.reachable && <div className="jp-clustersdk-error">{cluster.error}</div>}
      {cluster.restarts && (
        <div className="jp-clustersdk-cluster-restarts" title={cluster.restarts.detail}>
          {cluster.restarts.text}
        </div>
      )}
      {cluster.hosts.map(host => (
        <div className="jp-clustersdk-host" key={host.host}>
          <div className="jp-clustersdk-host-name">host {host.host}</div>
          <div className="jp-clustersdk-slots">
            {host.slots.map(slot => (
              <div
                key={slot.key}
                className={'jp-clustersdk-slot' + (slot.busy ? ' jp-mod-busy' : '')}
                data-kind={slot.cpu ? 'cpu' : 'cuda'}
              >
                <div className="jp-clustersdk-slot-head">
                  <span className="jp-clustersdk-slot-label">{slot.label}</span>
                  {slot.cores && (
                    <span
                      className="jp-clustersdk-slot-cores"
                      title="the CPU cores its worker runs on"
                    >
                      {slot.cores}
                    </span>
                  )}
                  <span className="jp-clustersdk-slot-state">
                    {slot.busy ? `busy: ${slot.jobName}` : 'free'}
                  </span>
                </div>
                <Bars bars={slot.bars} />
              </div>
            ))}
          </div>
        </div>
      ))}
      <div className="jp-clustersdk-jobs">
        {cluster.reachable && live.length === 0 && (
          <div className="jp-clustersdk-empty">No job running or queued.</div>
        )}
        {live.map(row)}
        {ended.length > 0 && (
          <details className="jp-clustersdk-ended">
            <summary>Ended ({ended.length})</summary>
            {ended.map(row)}
          </details>
        )}
      </div>
    </section>
  );
}

function JobRow(props: {
  job: IJobJSON;
  selected: boolean;
  busy: boolean;
  onAction: (action: Action) => void;
  onOpen: () => void;
  onInsert: () => void;
}): JSX.Element {
  const { job } = props;
  return (
    <div
      className={'jp-clustersdk-job' + (props.selected ? ' jp-mod-selected' : '')}
      data-job={job.id}
      data-name={job.name}
    >
      <div className="jp-clustersdk-job-head">
        <button
          className="jp-clustersdk-job-name"
          title={`Open the panel of job ${job.name}`}
          onClick={props.onOpen}
        >
          {job.name}
        </button>
        <Badge status={String(job.status)} />
      </div>
      <div className="jp-clustersdk-job-meta">{jobMeta(job)}</div>
      {job.reason && <div className="jp-clustersdk-job-reason">{job.reason}</div>}
      {job.progress && <ProgressBar job={job} />}
      <div className="jp-clustersdk-job-tools">
        <ActionButtons job={job} busy={props.busy} onAction={props.onAction} />
        <button
          className="jp-clustersdk-insert"
          title={`Insert code that attaches to job ${job.name} into the active notebook`}
          onClick={props.onInsert}
        >
          Insert attach code
        </button>
      </div>
    </div>
  );
}
