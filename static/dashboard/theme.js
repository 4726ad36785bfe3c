/*
 * Shared look of the dashboard charts: colours from the stylesheet's CSS variables (so dark
 * mode follows it), Chart.js defaults, number formatting and axis helpers.
 */

const rootStyle = getComputedStyle(document.documentElement);

function cssVar(name, fallback) {
  const value = rootStyle.getPropertyValue(name).trim();
  return value || fallback;
}

export const C = {
  blue: cssVar("--c-blue", "#0072b2"),
  orange: cssVar("--c-orange", "#e69f00"),
  green: cssVar("--c-green", "#009e73"),
  pink: cssVar("--c-pink", "#cc79a7"),
  sky: cssVar("--c-sky", "#56b4e9"),
  red: cssVar("--c-red", "#d55e00"),
  yellow: cssVar("--c-yellow", "#c9b400"),
  grey: cssVar("--c-grey", "#8a93a3"),
};
export const PALETTE = [C.blue, C.orange, C.green, C.pink, C.sky, C.red, C.yellow];
// Colour names a stacked series may carry (StackedSeries.color in specs.py).
export const NAMED = {
  ok: C.green,
  warn: C.orange,
  muted: C.grey,
  a: C.blue,
  b: C.orange,
  tie: C.grey,
  bad: C.red,
};
export const TEXT = cssVar("--text", "#1d2330");
export const MUTED = cssVar("--muted", "#5b6475");
export const GRID = cssVar("--border", "#d5d9e2");
export const SURFACE = cssVar("--surface", "#ffffff");
export const FONT = cssVar("--font", "system-ui, sans-serif");

export function applyDefaults(Chart) {
  Chart.defaults.color = MUTED;
  Chart.defaults.borderColor = GRID;
  Chart.defaults.font.family = FONT;
  Chart.defaults.font.size = 12;
  Chart.defaults.animation = false;
  Chart.defaults.responsive = true;
  Chart.defaults.maintainAspectRatio = false;
}

export function alpha(color, a) {
  let hex = color.replace("#", "");
  if (hex.length === 3) {
    hex = hex.replace(/(.)/g, "$1$1");
  }
  if (hex.length !== 6) {
    return color;
  }
  const n = parseInt(hex, 16);
  return "rgba(" + ((n >> 16) & 255) + "," + ((n >> 8) & 255) + "," + (n & 255) + "," + a + ")";
}

export function isNum(v) {
  return typeof v === "number" && isFinite(v);
}

export function fmt(v, percent) {
  if (!isNum(v)) {
    return "–";
  }
  if (percent) {
    return (v * 100).toFixed(1) + "%";
  }
  if (Math.abs(v) >= 100) {
    return v.toFixed(0);
  }
  return v.toFixed(3);
}

export function tick(percent) {
  return (value) => {
    if (percent) {
      return Math.round(value * 100) + "%";
    }
    return Math.abs(value) >= 100 ? Math.round(value) : +value.toFixed(3);
  };
}

// Round an axis range out to a "nice" step (1, 2 or 5 x 10^k) so the end ticks read well.
export function niceRange(lo, hi) {
  const span = hi - lo || Math.abs(hi) || 1;
  const raw = span / 5;
  const power = Math.pow(10, Math.floor(Math.log10(raw)));
  const step = [1, 2, 5, 10].map((m) => m * power).filter((s) => s >= raw)[0];
  return [Math.floor(lo / step) * step, Math.ceil(hi / step) * step];
}

export function axisTitle(text) {
  return { display: !!text, text: text || "", color: MUTED };
}

export function canvasIn(el) {
  const canvas = document.createElement("canvas");
  el.appendChild(canvas);
  return canvas;
}
