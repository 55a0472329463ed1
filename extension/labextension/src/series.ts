/**
 * The job panel's chart data: per-rank series of a scalar and of throughput, kept
 * bounded however long the job runs, and what a chart draws from them: one line per
 * rank up to MAX_LINES ranks, past that a min/median/max band over the ranks (a chart
 * of 64 lines reads as noise). Pure: no DOM, unit-tested in Node.
 */

import { IHistoryRow } from './models';

/** Ranks drawn as separate lines; more become a band. */
export const MAX_LINES = 8;
/** Points kept per series before every other one is dropped. */
export const MAX_POINTS = 1000;
/** Seconds of a rank's steps that make one throughput point. */
export const RATE_WINDOW = 1.0;
/** Bins a band is computed over. */
export const BAND_BINS = 200;

export type Point = [number, number];

/** At most `cap` points covering the whole run: thinned evenly when full. */
export class Series {
  points: Point[] = [];
  private tail: Point | null = null;
  private stride = 1;
  private count = 0;

  constructor(readonly cap: number = MAX_POINTS) {}

  add(x: number, y: number): void {
    // a resume from an older checkpoint logs steps again: forget the rewound ones
    if (this.tail && this.tail[0] >= x) {
      this.tail = null;
    }
    while (this.points.length && this.points[this.points.length - 1][0] >= x) {
      this.points.pop();
    }
    this.count += 1;
    if (this.count % this.stride !== 0 && this.points.length) {
      this.tail = [x, y];
      return;
    }
    this.tail = null;
    this.points.push([x, y]);
    if (this.points.length > this.cap) {
      this.points = this.points.filter((_, i) => i % 2 === 0);
      this.stride *= 2;
    }
  }

  /** Every kept point, and the newest one even when thinning skipped it. */
  all(): Point[] {
    return this.tail ? [...this.points, this.tail] : this.points;
  }
}

/** Every scalar's series per rank, and each rank's steps/s, fed with history rows. */
export class RunSeries {
  readonly scalars = new Map<string, Map<number, Series>>();
  readonly rate = new Map<number, Series>();
  private anchors = new Map<number, { time: number; step: number }>();
  last = 0; // the history cursor: the next read's `since`

  constructor(readonly cap: number = MAX_POINTS) {}

  add(rows: IHistoryRow[]): void {
    for (const row of rows) {
      this.last = Math.max(this.last, row.seq);
      for (const [name, value] of Object.entries(row)) {
        if (name === 'seq' || name === 'rank' || name === 'step' || name === 'time') {
          continue;
        }
        if (typeof value !== 'number' || !Number.isFinite(value)) {
          continue;
        }
        this.series(this.scalars, name, row.rank).add(row.step, value);
      }
      this.addRate(row);
    }
  }

  private addRate(row: IHistoryRow): void {
    const anchor = this.anchors.get(row.rank);
    if (!anchor || row.step < anchor.step) {
      this.anchors.set(row.rank, { time: row.time, step: row.step });
      return;
    }
    const dt = row.time - anchor.time;
    if (dt >= RATE_WINDOW) {
      let series = this.rate.get(row.rank);
      if (!series) {
        series = new Series(this.cap);
        this.rate.set(row.rank, series);
      }
      series.add(row.step, (row.step - anchor.step) / dt);
      this.anchors.set(row.rank, { time: row.time, step: row.step });
    }
  }

  private series(
    into: Map<string, Map<number, Series>>,
    name: string,
    rank: number
  ): Series {
    let ranks = into.get(name);
    if (!ranks) {
      ranks = new Map();
      into.set(name, ranks);
    }
    let series = ranks.get(rank);
    if (!series) {
      series = new Series(this.cap);
      ranks.set(rank, series);
    }
    return series;
  }

  /** Logged scalar names, loss first. */
  names(): string[] {
    return [...this.scalars.keys()].sort((a, b) =>
      a === 'loss' ? -1 : b === 'loss' ? 1 : a.localeCompare(b)
    );
  }
}

export interface ILine {
  rank: number;
  points: Point[];
}

export interface IBand {
  /** [x, min, median, max] per bin that has a value. */
  rows: [number, number, number, number][];
  ranks: number;
}

export interface IChart {
  mode: 'lines' | 'band' | 'empty';
  lines: ILine[];
  band: IBand | null;
  x: [number, number];
  y: [number, number];
}

/** A y axis spans at least +-10% of its values' level. */
export const MIN_SPAN = 0.1;

/** Whether a chart's title (or unit) names a throughput, whose axis starts at 0. */
export function isThroughput(title: string): boolean {
  return /(throughput|per_s|per_sec|per_second|\/s)\)?$/i.test(title.trim());
}

/**
 * The range of an axis that shows values from `lo` to `hi`: never a sliver (one
 * point, or a throughput steady to four digits, would zoom into 33.815..33.820 and
 * make noise look like a collapse). An axis with a `start` (a throughput: 0) runs from
 * it to `hi` (to start + 1 when every value is at it); a free axis is the values'
 * range, but at least +-10% of their level (the largest magnitude) around its middle,
 * and -1..1 when every value is 0. The same rule as the notebook dashboard's
 * (clustersdk/widgets/charts.py).
 */
export function axisRange(lo: number, hi: number, start: number | null = null): [number, number] {
  if (start !== null) {
    const low = Math.min(lo, start);
    return hi > low ? [low, hi] : [low, low + 1];
  }
  const half = MIN_SPAN * Math.max(Math.abs(lo), Math.abs(hi)) || 1;
  if (hi - lo >= 2 * half) {
    return [lo, hi];
  }
  const middle = (lo + hi) / 2;
  return [middle - half, middle + half];
}

/**
 * What to draw for per-rank series: lines up to `maxLines` ranks, else a band; the y
 * axis by axisRange (`yStart`: 0 for a throughput).
 */
export function chart(
  byRank: Map<number, Series> | undefined,
  maxLines: number = MAX_LINES,
  bins: number = BAND_BINS,
  yStart: number | null = null
): IChart {
  const lines: ILine[] = [...(byRank ?? new Map<number, Series>())]
    .map(([rank, s]) => ({ rank, points: s.all() }))
    .filter(l => l.points.length > 0)
    .sort((a, b) => a.rank - b.rank);
  if (lines.length === 0) {
    return { mode: 'empty', lines: [], band: null, x: [0, 1], y: [0, 1] };
  }
  const x = xExtent(lines.flatMap(l => l.points.map(p => p[0])));
  const yRange = (values: number[]) => {
    const [lo, hi] = extent(values);
    return axisRange(lo, hi, yStart);
  };
  if (lines.length <= maxLines) {
    const y = yRange(lines.flatMap(l => l.points.map(p => p[1])));
    return { mode: 'lines', lines, band: null, x, y };
  }
  const band = bandOf(lines, x, bins);
  const y = yRange(band.rows.flatMap(r => [r[1], r[3]]));
  return { mode: 'band', lines: [], band, x, y };
}

/**
 * Min, median and max over the ranks in each of `bins` slices of x: each rank
 * contributes its last value in the slice (ranks may be thinned differently).
 */
export function bandOf(lines: ILine[], x: [number, number], bins: number): IBand {
  const width = (x[1] - x[0]) / bins || 1;
  const perBin = new Map<number, Map<number, number>>();
  for (const line of lines) {
    for (const [px, py] of line.points) {
      const bin = Math.min(Math.floor((px - x[0]) / width), bins - 1);
      let values = perBin.get(bin);
      if (!values) {
        values = new Map();
        perBin.set(bin, values);
      }
      values.set(line.rank, py);
    }
  }
  const rows: [number, number, number, number][] = [];
  for (const bin of [...perBin.keys()].sort((a, b) => a - b)) {
    const values = [...perBin.get(bin)!.values()].sort((a, b) => a - b);
    rows.push([x[0] + (bin + 0.5) * width, values[0], median(values), values[values.length - 1]]);
  }
  return { rows, ranks: lines.length };
}

/** The median of sorted values. */
export function median(sorted: number[]): number {
  const mid = Math.floor(sorted.length / 2);
  return sorted.length % 2 ? sorted[mid] : (sorted[mid - 1] + sorted[mid]) / 2;
}

function extent(values: number[]): [number, number] {
  let lo = Infinity;
  let hi = -Infinity;
  for (const v of values) {
    lo = Math.min(lo, v);
    hi = Math.max(hi, v);
  }
  return Number.isFinite(lo) ? [lo, hi] : [0, 1];
}

/** The x axis: the steps' range, widened around a lone one. */
function xExtent(values: number[]): [number, number] {
  const [lo, hi] = extent(values);
  if (lo === hi) {
    const pad = Math.abs(lo) * 0.05 || 0.5;
    return [lo - pad, hi + pad];
  }
  return [lo, hi];
}

/** An SVG path through the points, scaled into a width x height box (y grows down). */
export function svgPath(
  points: Point[],
  x: [number, number],
  y: [number, number],
  width: number,
  height: number
): string {
  const sx = (v: number) => ((v - x[0]) / (x[1] - x[0] || 1)) * width;
  const sy = (v: number) => height - ((v - y[0]) / (y[1] - y[0] || 1)) * height;
  return points
    .map(([px, py], i) => `${i ? 'L' : 'M'}${sx(px).toFixed(1)},${sy(py).toFixed(1)}`)
    .join('');
}

/** The band's filled area (min up to max and back) as one closed SVG path. */
export function bandPath(
  band: IBand,
  x: [number, number],
  y: [number, number],
  width: number,
  height: number
): string {
  const upper = band.rows.map(r => [r[0], r[3]] as Point);
  const lower = band.rows.map(r => [r[0], r[1]] as Point).reverse();
  const path = svgPath([...upper, ...lower], x, y, width, height);
  return path ? `${path}Z` : '';
}

/** A tick's label, with as many decimals as the spacing of the ticks needs. */
export function tickLabel(value: number, spacing: number): string {
  if (Math.abs(value) >= 1e6 || (value !== 0 && Math.abs(value) < 1e-4)) {
    return value.toExponential(1);
  }
  const decimals = spacing > 0 ? Math.max(0, Math.min(6, -Math.floor(Math.log10(spacing)))) : 0;
  return value.toFixed(decimals);
}

/** About `count` round tick values covering [lo, hi]. */
export function ticks(lo: number, hi: number, count = 4): number[] {
  if (!(hi > lo)) {
    return [lo];
  }
  const raw = (hi - lo) / count;
  const magnitude = 10 ** Math.floor(Math.log10(raw));
  const step = [1, 2, 5, 10].map(m => m * magnitude).find(s => s >= raw) ?? raw;
  const out: number[] = [];
  for (let v = Math.ceil(lo / step) * step; v <= hi + step * 1e-9; v += step) {
    out.push(Number(v.toPrecision(12)));
  }
  return out;
}
