/*
 * Training curves (CurvesChart in specs.py): one small chart per metric, raw and smoothed.
 * Each alarm is a dashed line at its first step on every curve; its label (the alarm's kind)
 * sits only on the curve the alarm is about, where the line is stronger.
 */
import { C, FONT, PALETTE, alpha, axisTitle, canvasIn, fmt } from "../theme.js";

const alarmLines = {
  id: "alarmLines",
  afterDatasetsDraw(chart, args, opts) {
    if (!opts || !opts.alarms || !opts.alarms.length) {
      return;
    }
    const ctx = chart.ctx;
    const area = chart.chartArea;
    let labelled = 0;
    ctx.save();
    ctx.font = "11px " + FONT;
    opts.alarms.forEach((alarm) => {
      const x = chart.scales.x.getPixelForValue(alarm.step);
      if (x < area.left || x > area.right) {
        return;
      }
      const own = alarm.metric === opts.metric;
      ctx.strokeStyle = own ? C.red : alpha(C.red, 0.35);
      ctx.lineWidth = own ? 1.5 : 1;
      ctx.setLineDash([5, 3]);
      ctx.beginPath();
      ctx.moveTo(x, area.top);
      ctx.lineTo(x, area.bottom);
      ctx.stroke();
      if (own) {
        ctx.setLineDash([]);
        ctx.fillStyle = C.red;
        const left = x < area.right - 110;
        ctx.textAlign = left ? "left" : "right";
        ctx.fillText(alarm.kind + " @" + alarm.step, x + (left ? 4 : -4), area.top + 12 + 13 * labelled);
        labelled += 1;
      }
    });
    ctx.restore();
  },
};

function curveCell(grid, curve) {
  const cell = document.createElement("div");
  cell.className = "curve-cell";
  const heading = document.createElement("h3");
  heading.textContent = curve.title + " ";
  const source = document.createElement("span");
  source.className = "curve-source";
  source.textContent = curve.source;
  heading.appendChild(source);
  const box = document.createElement("div");
  box.className = "curve-canvas";
  cell.appendChild(heading);
  cell.appendChild(box);
  grid.appendChild(cell);
  return box;
}

export function curves(Chart, el, spec) {
  const grid = document.createElement("div");
  grid.className = "curve-grid";
  el.appendChild(grid);
  spec.charts.forEach((c, i) => {
    const box = curveCell(grid, c);
    const color = PALETTE[i % PALETTE.length];
    const radius = c.points.length < 25 ? 2 : 0;
    new Chart(canvasIn(box), {
      type: "line",
      data: {
        datasets: [
          {
            label: "raw",
            data: c.points.map((p) => ({ x: p[0], y: p[1] })),
            borderColor: alpha(color, 0.35),
            backgroundColor: alpha(color, 0.35),
            borderWidth: 1,
            pointRadius: radius,
          },
          {
            label: "smoothed",
            data: c.points.map((p) => ({ x: p[0], y: p[2] })),
            borderColor: color,
            backgroundColor: color,
            borderWidth: 2,
            pointRadius: 0,
          },
        ],
      },
      options: {
        interaction: { mode: "nearest", axis: "x", intersect: false },
        scales: {
          x: { type: "linear", title: axisTitle("step"), ticks: { maxTicksLimit: 6 } },
          y: { ticks: { maxTicksLimit: 5 } },
        },
        plugins: {
          legend: { display: false },
          alarmLines: { alarms: spec.alarms, metric: c.metric },
          tooltip: {
            callbacks: {
              label(ctx) {
                return ctx.dataset.label + ": " + fmt(ctx.parsed.y);
              },
            },
          },
        },
      },
      plugins: [alarmLines],
    });
  });
}
