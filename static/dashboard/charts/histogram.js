/* Reward-margin histogram (HistogramChart in specs.py): bins left of zero in red. */
import { C, SURFACE, alpha, axisTitle, canvasIn, fmt } from "../theme.js";

export function histogram(Chart, el, spec) {
  el.style.height = "260px";
  const centers = spec.counts.map((_, i) => (spec.edges[i] + spec.edges[i + 1]) / 2);
  return new Chart(canvasIn(el), {
    type: "bar",
    data: {
      labels: centers.map((c) => +c.toPrecision(2)),
      datasets: [
        {
          label: "pairs",
          data: spec.counts,
          backgroundColor: centers.map((c) => (c < 0 ? alpha(C.red, 0.8) : alpha(C.blue, 0.8))),
          borderColor: SURFACE,
          borderWidth: 1,
          barPercentage: 1,
          categoryPercentage: 1,
        },
      ],
    },
    options: {
      scales: {
        x: { title: axisTitle(spec.x_label), grid: { display: false } },
        y: { title: axisTitle("pairs"), beginAtZero: true, ticks: { precision: 0 } },
      },
      plugins: {
        legend: { display: false },
        tooltip: {
          callbacks: {
            title(items) {
              const i = items[0].dataIndex;
              return fmt(spec.edges[i]) + " to " + fmt(spec.edges[i + 1]);
            },
          },
        },
      },
    },
  });
}
