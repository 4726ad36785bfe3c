/*
 * Forest plot (ForestChart in specs.py): per row, each series' estimate as a dot on its
 * interval, with an optional dashed reference line (e.g. 50% = no preference).
 */
import {
  FONT,
  MUTED,
  PALETTE,
  SURFACE,
  TEXT,
  alpha,
  axisTitle,
  canvasIn,
  fmt,
  isNum,
  niceRange,
  tick,
} from "../theme.js";

const referenceLine = {
  id: "referenceLine",
  beforeDatasetsDraw(chart, args, opts) {
    if (!opts || !isNum(opts.value)) {
      return;
    }
    const x = chart.scales.x.getPixelForValue(opts.value);
    const area = chart.chartArea;
    if (x < area.left - 0.5 || x > area.right + 0.5) {
      return;
    }
    const ctx = chart.ctx;
    ctx.save();
    ctx.strokeStyle = MUTED;
    ctx.lineWidth = 1;
    ctx.setLineDash([4, 4]);
    ctx.beginPath();
    ctx.moveTo(x, area.top);
    ctx.lineTo(x, area.bottom);
    ctx.stroke();
    if (opts.label) {
      ctx.setLineDash([]);
      ctx.fillStyle = MUTED;
      ctx.font = "11px " + FONT;
      ctx.textAlign = "center";
      ctx.fillText(opts.label, x, area.top - 4);
    }
    ctx.restore();
  },
};

// The floating bar is the interval; this draws its end caps and the estimate.
const estimateMarkers = {
  id: "estimateMarkers",
  afterDatasetsDraw(chart) {
    const ctx = chart.ctx;
    const xScale = chart.scales.x;
    chart.data.datasets.forEach((dataset, di) => {
      if (!dataset.estimates || !chart.isDatasetVisible(di)) {
        return;
      }
      chart.getDatasetMeta(di).data.forEach((bar, i) => {
        const estimate = dataset.estimates[i];
        const interval = dataset.data[i];
        if (!isNum(estimate) || !isNum(bar.y)) {
          return;
        }
        const y = bar.y;
        ctx.save();
        ctx.strokeStyle = dataset.borderColor;
        ctx.lineWidth = 1.5;
        if (interval && interval[0] !== interval[1]) {
          [interval[0], interval[1]].forEach((end) => {
            const xe = xScale.getPixelForValue(end);
            ctx.beginPath();
            ctx.moveTo(xe, y - 5);
            ctx.lineTo(xe, y + 5);
            ctx.stroke();
          });
        }
        const x = xScale.getPixelForValue(estimate);
        ctx.beginPath();
        ctx.arc(x, y, 4.5, 0, 2 * Math.PI);
        ctx.fillStyle = dataset.borderColor;
        ctx.fill();
        ctx.strokeStyle = SURFACE;
        ctx.lineWidth = 1.5;
        ctx.stroke();
        ctx.restore();
      });
    });
  },
};

export function forest(Chart, el, spec) {
  const rows = spec.labels.length;
  const k = spec.series.length;
  el.style.height = 64 + rows * Math.max(28, 14 * k + 14) + (k > 1 ? 26 : 0) + "px";
  let values = [];
  spec.series.forEach((s) => {
    values = values.concat(s.estimate, s.low, s.high);
  });
  if (isNum(spec.reference)) {
    values.push(spec.reference);
  }
  values = values.filter(isNum);
  const range = niceRange(Math.min(...values), Math.max(...values));
  let min = isNum(spec.x_min) ? spec.x_min : range[0];
  let max = isNum(spec.x_max) ? spec.x_max : range[1];
  if (spec.percent) {
    min = Math.max(0, min);
    max = Math.min(1, max);
  }
  const datasets = spec.series.map((s, si) => {
    const color = PALETTE[si % PALETTE.length];
    return {
      label: s.name,
      data: s.estimate.map((estimate, i) => {
        if (isNum(s.low[i]) && isNum(s.high[i])) {
          return [s.low[i], s.high[i]];
        }
        return isNum(estimate) ? [estimate, estimate] : null;
      }),
      estimates: s.estimate,
      backgroundColor: alpha(color, 0.6),
      borderColor: color,
      borderWidth: 0,
      borderSkipped: false,
      maxBarThickness: 3,
      categoryPercentage: k > 1 ? 0.75 : 0.5,
      barPercentage: 1,
    };
  });
  return new Chart(canvasIn(el), {
    type: "bar",
    data: { labels: spec.labels, datasets },
    options: {
      indexAxis: "y",
      layout: { padding: { top: 16, right: 12 } },
      scales: {
        x: { min, max, title: axisTitle(spec.x_label), ticks: { callback: tick(spec.percent) } },
        y: { grid: { display: false }, ticks: { color: TEXT, autoSkip: false } },
      },
      plugins: {
        legend: { display: k > 1, position: "bottom", labels: { boxWidth: 12, boxHeight: 4 } },
        tooltip: {
          callbacks: {
            label(ctx) {
              const dataset = ctx.dataset;
              const estimate = dataset.estimates[ctx.dataIndex];
              const interval = dataset.data[ctx.dataIndex];
              let text = dataset.label + ": " + fmt(estimate, spec.percent);
              if (interval && interval[0] !== interval[1]) {
                text += "  (95% CI " + fmt(interval[0], spec.percent) + " – ";
                text += fmt(interval[1], spec.percent) + ")";
              }
              return text;
            },
          },
        },
        referenceLine: { value: spec.reference, label: spec.reference_label },
      },
    },
    plugins: [referenceLine, estimateMarkers],
  });
}
