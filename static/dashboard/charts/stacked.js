/* Stacked bars (StackedChart in specs.py): counts, or shares of each bar when percent. */
import { NAMED, PALETTE, SURFACE, TEXT, axisTitle, canvasIn, fmt, tick } from "../theme.js";

export function stacked(Chart, el, spec) {
  const horizontal = spec.horizontal !== false;
  if (horizontal) {
    el.style.height = 84 + spec.labels.length * 34 + "px";
  }
  const datasets = spec.series.map((s, i) => ({
    label: s.name,
    data: s.values,
    backgroundColor: NAMED[s.color] || PALETTE[i % PALETTE.length],
    borderColor: SURFACE,
    borderWidth: 1,
    barPercentage: 0.85,
    categoryPercentage: 0.9,
  }));
  const valueAxis = {
    stacked: true,
    title: axisTitle(spec.x_label),
    ticks: { callback: tick(spec.percent) },
  };
  if (spec.percent) {
    valueAxis.min = 0;
    valueAxis.max = 1;
  }
  const categoryAxis = { stacked: true, grid: { display: false }, ticks: { color: TEXT } };
  return new Chart(canvasIn(el), {
    type: "bar",
    data: { labels: spec.labels, datasets },
    options: {
      indexAxis: horizontal ? "y" : "x",
      scales: horizontal ? { x: valueAxis, y: categoryAxis } : { x: categoryAxis, y: valueAxis },
      plugins: {
        legend: { position: "bottom", labels: { boxWidth: 12 } },
        tooltip: {
          callbacks: {
            label(ctx) {
              return ctx.dataset.label + ": " + (spec.percent ? fmt(ctx.raw, true) : ctx.raw);
            },
          },
        },
      },
    },
  });
}
