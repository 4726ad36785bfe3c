/*
 * Reliability diagram (ReliabilityChart in specs.py): accuracy against confidence, point
 * size growing with the pairs in the bin, the diagonal as "perfectly calibrated".
 */
import { MUTED, PALETTE, alpha, axisTitle, canvasIn, fmt, tick } from "../theme.js";

export function reliability(Chart, el, spec) {
  el.style.height = "320px";
  let maxN = 1;
  spec.series.forEach((s) => {
    s.points.forEach((p) => {
      maxN = Math.max(maxN, p.n || 0);
    });
  });
  const datasets = [
    {
      label: "Perfectly calibrated",
      data: [
        { x: 0.5, y: 0.5 },
        { x: 1, y: 1 },
      ],
      showLine: true,
      borderColor: MUTED,
      borderDash: [4, 4],
      borderWidth: 1,
      pointRadius: 0,
      pointHoverRadius: 0,
    },
  ];
  spec.series.forEach((s, i) => {
    const color = PALETTE[i % PALETTE.length];
    datasets.push({
      label: s.name,
      data: s.points,
      showLine: true,
      borderColor: color,
      backgroundColor: alpha(color, 0.85),
      borderWidth: 2,
      pointRadius: s.points.map((p) => 3 + 7 * Math.sqrt((p.n || 0) / maxN)),
      pointHoverRadius: 9,
      clip: 12,
    });
  });
  return new Chart(canvasIn(el), {
    type: "scatter",
    data: { datasets },
    options: {
      layout: { padding: { top: 10, right: 10 } },
      scales: {
        x: { min: 0.5, max: 1, title: axisTitle(spec.x_label), ticks: { callback: tick(true) } },
        y: { min: 0, max: 1, title: axisTitle(spec.y_label), ticks: { callback: tick(true) } },
      },
      plugins: {
        legend: { position: "bottom", labels: { boxWidth: 12 } },
        tooltip: {
          filter: (item) => item.datasetIndex > 0,
          callbacks: {
            label(ctx) {
              const p = ctx.raw;
              return (
                ctx.dataset.label + ": confidence " + fmt(p.x, true) + ", accuracy " +
                fmt(p.y, true) + " (" + p.n + " pairs)"
              );
            },
          },
        },
      },
    },
  });
}
