/**
 * An SVG chart of per-rank series: one coloured line per rank, or, past MAX_LINES
 * ranks, the min-max band with the median line (see series.ts).
 */

import * as React from 'react';

import {
  BAND_BINS,
  bandPath,
  chart,
  isThroughput,
  MAX_LINES,
  Series,
  svgPath,
  tickLabel,
  ticks
} from './series';

const WIDTH = 460;
const HEIGHT = 170;
const MARGIN = { left: 52, right: 10, top: 8, bottom: 22 };
const COLORS = [
  '#2563eb', '#dc2626', '#16a34a', '#d97706', '#7c3aed', '#0891b2', '#db2777', '#4b5563'
];

export function RankChart(props: {
  title: string;
  byRank: Map<number, Series> | undefined;
  unit?: string;
}): JSX.Element {
  // a throughput's axis starts at 0: steady steps/s is a flat line, not a cliff
  const zero = isThroughput(props.title) || isThroughput(props.unit ?? '');
  const c = chart(props.byRank, MAX_LINES, BAND_BINS, zero ? 0 : null);
  const w = WIDTH - MARGIN.left - MARGIN.right;
  const h = HEIGHT - MARGIN.top - MARGIN.bottom;
  const sx = (v: number) => ((v - c.x[0]) / (c.x[1] - c.x[0] || 1)) * w;
  const sy = (v: number) => h - ((v - c.y[0]) / (c.y[1] - c.y[0] || 1)) * h;
  const yTicks = ticks(c.y[0], c.y[1]);
  const xTicks = ticks(c.x[0], c.x[1], 5);
  const spacing = (t: number[]) => (t.length > 1 ? t[1] - t[0] : 1);
  return (
    <figure className="jp-clustersdk-chart" data-mode={c.mode} data-title={props.title}>
      <figcaption>
        {props.title}
        {props.unit ? ` (${props.unit})` : ''}
        {c.mode === 'band' && c.band && (
          <span className="jp-clustersdk-chart-note">
            {' '}
            · {c.band.ranks} ranks: min–max band, median line
          </span>
        )}
      </figcaption>
      <svg viewBox={`0 0 ${WIDTH} ${HEIGHT}`} width="100%" role="img" aria-label={props.title}>
        <g transform={`translate(${MARGIN.left},${MARGIN.top})`}>
          {c.mode === 'empty' && (
            <text x={w / 2} y={h / 2} textAnchor="middle" className="jp-clustersdk-chart-empty">
              no data yet
            </text>
          )}
          {c.mode !== 'empty' &&
            yTicks.map(v => (
              <g key={`y${v}`} className="jp-clustersdk-tick">
                <line x1={0} x2={w} y1={sy(v)} y2={sy(v)} />
                <text x={-6} y={sy(v)} dy="0.32em" textAnchor="end">
                  {tickLabel(v, spacing(yTicks))}
                </text>
              </g>
            ))}
          {c.mode !== 'empty' &&
            xTicks.map(v => (
              <text
                key={`x${v}`}
                className="jp-clustersdk-xtick"
                x={sx(v)}
                y={h + 15}
                textAnchor="middle"
              >
                {tickLabel(v, spacing(xTicks))}
              </text>
            ))}
          {c.mode === 'lines' &&
            c.lines.map(line => {
              const color = COLORS[line.rank % COLORS.length];
              const [lx, ly] = line.points[line.points.length - 1];
              return (
                <g key={line.rank}>
                  <path
                    className="jp-clustersdk-line"
                    data-rank={line.rank}
                    d={svgPath(line.points, c.x, c.y, w, h)}
                    stroke={color}
                  />
                  {/* the newest point: where the rank is now (and a lone point shows) */}
                  <circle cx={sx(lx)} cy={sy(ly)} r={2.5} fill={color} />
                </g>
              );
            })}
          {c.mode === 'band' && c.band && (
            <>
              <path className="jp-clustersdk-band" d={bandPath(c.band, c.x, c.y, w, h)} />
              <path
                className="jp-clustersdk-line jp-clustersdk-median"
                d={svgPath(c.band.rows.map(r => [r[0], r[2]]), c.x, c.y, w, h)}
              />
            </>
          )}
        </g>
      </svg>
      {c.mode === 'lines' && c.lines.length > 1 && (
        <div className="jp-clustersdk-legend">
          {c.lines.map(line => (
            <span key={line.rank}>
              <i style={{ background: COLORS[line.rank % COLORS.length] }} />
              rank {line.rank}
            </span>
          ))}
        </div>
      )}
    </figure>
  );
}
