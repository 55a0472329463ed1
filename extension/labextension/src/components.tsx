/**
 * Small React pieces both the sidebar and the job panel use: the status badge, the
 * progress bar, the action buttons (disabled with the reason as their tooltip).
 */

import * as React from 'react';

import {
  Action,
  ACTIONS,
  actionStates,
  goodputView,
  IBar,
  IJobJSON,
  progressView,
  STATUS_COLORS
} from './models';

export function Badge(props: { status: string }): JSX.Element {
  return (
    <span
      className="jp-clustersdk-badge"
      data-status={props.status}
      style={{ background: STATUS_COLORS[props.status] ?? '#6b7280' }}
    >
      {props.status}
    </span>
  );
}

export function ProgressBar(props: { job: IJobJSON }): JSX.Element {
  const view = progressView(props.job);
  const percent = view.fraction === null ? null : Math.round(view.fraction * 100);
  const text = [view.stepText, view.rateText, view.etaText].filter(Boolean).join(' · ');
  return (
    <div className="jp-clustersdk-progress" title={text}>
      <div className="jp-clustersdk-progress-track">
        <div
          className={
            'jp-clustersdk-progress-fill' +
            (percent === null ? ' jp-clustersdk-progress-unknown' : '')
          }
          style={{ width: percent === null ? '100%' : `${percent}%` }}
        />
      </div>
      <div className="jp-clustersdk-progress-text">{text}</div>
    </div>
  );
}

/** Where the job's wall time went: one bar of its buckets, and the line that says it. */
export function GoodputBar(props: { job: IJobJSON }): JSX.Element | null {
  const view = goodputView(props.job);
  if (!view) {
    return null;
  }
  return (
    <div className="jp-clustersdk-goodput">
      <div className="jp-clustersdk-goodput-track">
        {view.segments.map(s => (
          <div
            key={s.bucket}
            className={`jp-clustersdk-goodput-${s.bucket}`}
            title={`${s.label} ${s.seconds.toFixed(1)} s`}
            style={{ width: `${s.percent}%`, background: s.color }}
          />
        ))}
      </div>
      <div className="jp-clustersdk-goodput-text">{view.text}</div>
    </div>
  );
}

const LABELS: Record<Action, string> = {
  pause: 'Pause',
  resume: 'Resume',
  checkpoint: 'Checkpoint',
  suspend: 'Suspend',
  stop: 'Stop'
};

/** Pause / Resume / Checkpoint / Suspend / Stop, each greyed out with its reason. */
export function ActionButtons(props: {
  job: IJobJSON;
  busy: boolean;
  onAction: (action: Action) => void;
}): JSX.Element {
  const states = actionStates(props.job);
  return (
    <div className="jp-clustersdk-actions">
      {ACTIONS.map(action => {
        const state = states[action];
        const title = props.busy ? 'Waiting for the last action to finish' : state.reason
          || `${LABELS[action]} job ${props.job.name}`;
        // the tooltip sits on a wrapper: a disabled button gets no pointer events
        return (
          <span key={action} title={title} className="jp-clustersdk-action-wrap">
            <button
              className="jp-clustersdk-action"
              data-action={action}
              disabled={!state.enabled || props.busy}
              title={title}
              onClick={event => {
                event.stopPropagation();
                props.onAction(action);
              }}
            >
              {LABELS[action]}
            </button>
          </span>
        );
      })}
    </div>
  );
}

export function Bars(props: { bars: IBar[] }): JSX.Element {
  return (
    <div className="jp-clustersdk-bars">
      {props.bars.map(bar => (
        <div className="jp-clustersdk-bar" key={bar.label} title={`${bar.label}: ${bar.text}`}>
          <span className="jp-clustersdk-bar-label">{bar.label}</span>
          <span className="jp-clustersdk-bar-track">
            <span
              className="jp-clustersdk-bar-fill"
              style={{ width: `${Math.round((bar.fraction ?? 0) * 100)}%` }}
            />
          </span>
          <span className="jp-clustersdk-bar-text">{bar.text}</span>
        </div>
      ))}
    </div>
  );
}

/** "12:03:04" of a unix time (seconds). */
export function clock(time: number | null | undefined): string {
  if (time === null || time === undefined) {
    return '';
  }
  return new Date(time * 1000).toLocaleTimeString();
}
