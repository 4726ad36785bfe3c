/*
 * Lines over ordered categories (LinesChart in specs.py), e.g. distinct-n and repetition of
 * each policy version's answers; a missing value leaves a gap.
 */
import { PALETTE, alpha, axisTitle, canvasIn, fmt, tick } from "../theme.js";

export function lines(Chart, el, spec) {
  el.style.height = "280px";
  const datasets = spec.series.map((s, i) => {
    const color = PALETTE[i % PALETTE.length];
    return {
      label: s.name,
      data: s.values,
      borderColor: color,
      backgroundColor: alpha(color, 0.85),
      borderWidth: 2,
      pointRadius: 4,
      spanGaps: false,
    };
  });
  const valueAxis = { title: axisTitle(spec.y_label), ticks: { callback: tick(spec.percent) } };
  if (spec.percent) {
    valueAxis.min = 0;
    valueAxis.max = 1;
  }
  return new Chart(canvasIn(el), {
    type: "line",
    data: { labels: spec.labels, datasets },
    options: {
      layout: { padding: { top: 10, right: 10 } },
      scales: {
        x: { title: axisTitle(spec.x_label), grid: { display: false } },
        y: valueAxis,
      },
      plugins: {
        legend: { position: "bottom", labels: { boxWidth: 12 } },
        tooltip: {
          callbacks: {
            label(ctx) {
              return ctx.dataset.label + ": " + fmt(ctx.raw, spec.percent);
            },
          },
        },
      },
    },
  });
}
