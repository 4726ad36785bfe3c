/*
 * Scatter plot (ScatterChart in specs.py): one colour per series; the tooltip names the
 * point by its short label (never model text) and gives both coordinates.
 */
import { PALETTE, alpha, axisTitle, canvasIn, fmt } from "../theme.js";

export function scatter(Chart, el, spec) {
  el.style.height = "320px";
  const datasets = spec.series.map((s, i) => {
    const color = PALETTE[i % PALETTE.length];
    return {
      label: s.name,
      data: s.points.filter((p) => p.x !== null && p.y !== null),
      borderColor: color,
      backgroundColor: alpha(color, 0.6),
      pointRadius: 4,
      pointHoverRadius: 7,
    };
  });
  return new Chart(canvasIn(el), {
    type: "scatter",
    data: { datasets },
    options: {
      layout: { padding: { top: 10, right: 10 } },
      scales: {
        x: { title: axisTitle(spec.x_label) },
        y: { title: axisTitle(spec.y_label) },
      },
      plugins: {
        legend: { position: "bottom", labels: { boxWidth: 12 } },
        tooltip: {
          callbacks: {
            label(ctx) {
              const p = ctx.raw;
              return ctx.dataset.label + " " + p.label + ": (" + fmt(p.x) + ", " + fmt(p.y) + ")";
            },
          },
        },
      },
    },
  });
}
