/* Evaluation dashboard charts.
 *
 * The page carries every chart's data in one JSON block (<script type="application/json"
 * id="dashboard-charts">, written by Django's json_script) and an empty <div data-chart="key">
 * per chart. This file draws them with Chart.js (static/vendor/chart.umd.min.js). No inline
 * script or style anywhere (CSP): sizes are set through the CSSOM, colours come from CSS
 * variables so dark mode follows the stylesheet.
 *
 * Chart types (built in evaluation/dashboard_selectors.py):
 *   forest       estimate + interval per row, one or more series, optional reference line
 *   stacked      stacked bars (counts or shares)
 *   reliability  reliability diagram: accuracy vs confidence, point size ~ pairs per bin
 *   histogram    reward-margin histogram, bins left of zero in red
 *   curves       small multiples of training curves (raw + smoothed), alarms as dashed lines
 */
(function () {
  "use strict";

  var dataNode = document.getElementById("dashboard-charts");
  if (!dataNode || typeof window.Chart === "undefined") {
    return;
  }
  var Chart = window.Chart;
  var specs = JSON.parse(dataNode.textContent || "{}") || {};

  var rootStyle = getComputedStyle(document.documentElement);
  function cssVar(name, fallback) {
    var value = rootStyle.getPropertyValue(name).trim();
    return value || fallback;
  }

  var C = {
    blue: cssVar("--c-blue", "#0072b2"),
    orange: cssVar("--c-orange", "#e69f00"),
    green: cssVar("--c-green", "#009e73"),
    pink: cssVar("--c-pink", "#cc79a7"),
    sky: cssVar("--c-sky", "#56b4e9"),
    red: cssVar("--c-red", "#d55e00"),
    yellow: cssVar("--c-yellow", "#c9b400"),
    grey: cssVar("--c-grey", "#8a93a3"),
  };
  var PALETTE = [C.blue, C.orange, C.green, C.pink, C.sky, C.red, C.yellow];
  var NAMED = {
    ok: C.green,
    warn: C.orange,
    muted: C.grey,
    a: C.blue,
    b: C.orange,
    tie: C.grey,
    bad: C.red,
  };
  var TEXT = cssVar("--text", "#1d2330");
  var MUTED = cssVar("--muted", "#5b6475");
  var GRID = cssVar("--border", "#d5d9e2");
  var SURFACE = cssVar("--surface", "#ffffff");
  var FONT = cssVar("--font", "system-ui, sans-serif");

  Chart.defaults.color = MUTED;
  Chart.defaults.borderColor = GRID;
  Chart.defaults.font.family = FONT;
  Chart.defaults.font.size = 12;
  Chart.defaults.animation = false;
  Chart.defaults.responsive = true;
  Chart.defaults.maintainAspectRatio = false;

  function alpha(color, a) {
    var hex = color.replace("#", "");
    if (hex.length === 3) {
      hex = hex.replace(/(.)/g, "$1$1");
    }
    if (hex.length !== 6) {
      return color;
    }
    var n = parseInt(hex, 16);
    return "rgba(" + ((n >> 16) & 255) + "," + ((n >> 8) & 255) + "," + (n & 255) + "," + a + ")";
  }

  function isNum(v) {
    return typeof v === "number" && isFinite(v);
  }

  function fmt(v, percent) {
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

  function tick(percent) {
    return function (value) {
      if (percent) {
        return Math.round(value * 100) + "%";
      }
      return Math.abs(value) >= 100 ? Math.round(value) : +value.toFixed(3);
    };
  }

  // Round an axis range out to a "nice" step (1, 2 or 5 x 10^k) so the end ticks read well.
  function niceRange(lo, hi) {
    var span = hi - lo || Math.abs(hi) || 1;
    var raw = span / 5;
    var power = Math.pow(10, Math.floor(Math.log10(raw)));
    var step = [1, 2, 5, 10].map(function (m) {
      return m * power;
    }).filter(function (s) {
      return s >= raw;
    })[0];
    return [Math.floor(lo / step) * step, Math.ceil(hi / step) * step];
  }

  function axisTitle(text) {
    return { display: !!text, text: text || "", color: MUTED };
  }

  function canvasIn(el) {
    var canvas = document.createElement("canvas");
    el.appendChild(canvas);
    return canvas;
  }

  // A dashed vertical line at options.plugins.referenceLine.value (e.g. 50% = no preference).
  var referenceLine = {
    id: "referenceLine",
    beforeDatasetsDraw: function (chart, args, opts) {
      if (!opts || !isNum(opts.value)) {
        return;
      }
      var x = chart.scales.x.getPixelForValue(opts.value);
      var area = chart.chartArea;
      if (x < area.left - 0.5 || x > area.right + 0.5) {
        return;
      }
      var ctx = chart.ctx;
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

  // Forest plots: the floating bar is the interval; this draws its end caps and the estimate.
  var estimateMarkers = {
    id: "estimateMarkers",
    afterDatasetsDraw: function (chart) {
      var ctx = chart.ctx;
      var xScale = chart.scales.x;
      chart.data.datasets.forEach(function (dataset, di) {
        if (!dataset.estimates || !chart.isDatasetVisible(di)) {
          return;
        }
        var meta = chart.getDatasetMeta(di);
        meta.data.forEach(function (bar, i) {
          var estimate = dataset.estimates[i];
          var interval = dataset.data[i];
          if (!isNum(estimate) || !isNum(bar.y)) {
            return;
          }
          var y = bar.y;
          ctx.save();
          ctx.strokeStyle = dataset.borderColor;
          ctx.lineWidth = 1.5;
          if (interval && interval[0] !== interval[1]) {
            [interval[0], interval[1]].forEach(function (end) {
              var xe = xScale.getPixelForValue(end);
              ctx.beginPath();
              ctx.moveTo(xe, y - 5);
              ctx.lineTo(xe, y + 5);
              ctx.stroke();
            });
          }
          var x = xScale.getPixelForValue(estimate);
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

  // Training curves: a dashed line per alarm at its first step on every curve; the label
  // (the alarm's kind) only on the curve the alarm is about, where the line is stronger.
  var alarmLines = {
    id: "alarmLines",
    afterDatasetsDraw: function (chart, args, opts) {
      if (!opts || !opts.alarms || !opts.alarms.length) {
        return;
      }
      var ctx = chart.ctx;
      var area = chart.chartArea;
      var labelled = 0;
      ctx.save();
      ctx.font = "11px " + FONT;
      opts.alarms.forEach(function (alarm) {
        var x = chart.scales.x.getPixelForValue(alarm.step);
        if (x < area.left || x > area.right) {
          return;
        }
        var own = alarm.metric === opts.metric;
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
          var left = x < area.right - 110;
          ctx.textAlign = left ? "left" : "right";
          ctx.fillText(alarm.kind + " @" + alarm.step, x + (left ? 4 : -4), area.top + 12 + 13 * labelled);
          labelled += 1;
        }
      });
      ctx.restore();
    },
  };

  function forest(el, spec) {
    var rows = spec.labels.length;
    var k = spec.series.length;
    el.style.height = 64 + rows * Math.max(28, 14 * k + 14) + (k > 1 ? 26 : 0) + "px";
    var values = [];
    spec.series.forEach(function (s) {
      values = values.concat(s.estimate, s.low, s.high);
    });
    if (isNum(spec.reference)) {
      values.push(spec.reference);
    }
    values = values.filter(isNum);
    var range = niceRange(Math.min.apply(null, values), Math.max.apply(null, values));
    var min = isNum(spec.x_min) ? spec.x_min : range[0];
    var max = isNum(spec.x_max) ? spec.x_max : range[1];
    if (spec.percent) {
      min = Math.max(0, min);
      max = Math.min(1, max);
    }
    var datasets = spec.series.map(function (s, si) {
      var color = PALETTE[si % PALETTE.length];
      return {
        label: s.name,
        data: s.estimate.map(function (estimate, i) {
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
      data: { labels: spec.labels, datasets: datasets },
      options: {
        indexAxis: "y",
        layout: { padding: { top: 16, right: 12 } },
        scales: {
          x: {
            min: min,
            max: max,
            title: axisTitle(spec.x_label),
            ticks: { callback: tick(spec.percent) },
          },
          y: { grid: { display: false }, ticks: { color: TEXT, autoSkip: false } },
        },
        plugins: {
          legend: { display: k > 1, position: "bottom", labels: { boxWidth: 12, boxHeight: 4 } },
          tooltip: {
            callbacks: {
              label: function (ctx) {
                var dataset = ctx.dataset;
                var estimate = dataset.estimates[ctx.dataIndex];
                var interval = dataset.data[ctx.dataIndex];
                var text = dataset.label + ": " + fmt(estimate, spec.percent);
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

  function stacked(el, spec) {
    var horizontal = spec.horizontal !== false;
    if (horizontal) {
      el.style.height = 84 + spec.labels.length * 34 + "px";
    }
    var datasets = spec.series.map(function (s, i) {
      return {
        label: s.name,
        data: s.values,
        backgroundColor: NAMED[s.color] || PALETTE[i % PALETTE.length],
        borderColor: SURFACE,
        borderWidth: 1,
        barPercentage: 0.85,
        categoryPercentage: 0.9,
      };
    });
    var valueAxis = {
      stacked: true,
      title: axisTitle(spec.x_label),
      ticks: { callback: tick(spec.percent) },
    };
    if (spec.percent) {
      valueAxis.min = 0;
      valueAxis.max = 1;
    }
    var categoryAxis = { stacked: true, grid: { display: false }, ticks: { color: TEXT } };
    return new Chart(canvasIn(el), {
      type: "bar",
      data: { labels: spec.labels, datasets: datasets },
      options: {
        indexAxis: horizontal ? "y" : "x",
        scales: horizontal
          ? { x: valueAxis, y: categoryAxis }
          : { x: categoryAxis, y: valueAxis },
        plugins: {
          legend: { position: "bottom", labels: { boxWidth: 12 } },
          tooltip: {
            callbacks: {
              label: function (ctx) {
                return ctx.dataset.label + ": " + (spec.percent ? fmt(ctx.raw, true) : ctx.raw);
              },
            },
          },
        },
      },
    });
  }

  function reliability(el, spec) {
    el.style.height = "320px";
    var maxN = 1;
    spec.series.forEach(function (s) {
      s.points.forEach(function (p) {
        maxN = Math.max(maxN, p.n || 0);
      });
    });
    var datasets = [
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
    spec.series.forEach(function (s, i) {
      var color = PALETTE[i % PALETTE.length];
      datasets.push({
        label: s.name,
        data: s.points,
        showLine: true,
        borderColor: color,
        backgroundColor: alpha(color, 0.85),
        borderWidth: 2,
        pointRadius: s.points.map(function (p) {
          return 3 + 7 * Math.sqrt((p.n || 0) / maxN);
        }),
        pointHoverRadius: 9,
        clip: 12,
      });
    });
    return new Chart(canvasIn(el), {
      type: "scatter",
      data: { datasets: datasets },
      options: {
        layout: { padding: { top: 10, right: 10 } },
        scales: {
          x: { min: 0.5, max: 1, title: axisTitle(spec.x_label), ticks: { callback: tick(true) } },
          y: { min: 0, max: 1, title: axisTitle(spec.y_label), ticks: { callback: tick(true) } },
        },
        plugins: {
          legend: { position: "bottom", labels: { boxWidth: 12 } },
          tooltip: {
            filter: function (item) {
              return item.datasetIndex > 0;
            },
            callbacks: {
              label: function (ctx) {
                var p = ctx.raw;
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

  function histogram(el, spec) {
    el.style.height = "260px";
    var centers = spec.counts.map(function (_, i) {
      return (spec.edges[i] + spec.edges[i + 1]) / 2;
    });
    return new Chart(canvasIn(el), {
      type: "bar",
      data: {
        labels: centers.map(function (c) {
          return +c.toPrecision(2);
        }),
        datasets: [
          {
            label: "pairs",
            data: spec.counts,
            backgroundColor: centers.map(function (c) {
              return c < 0 ? alpha(C.red, 0.8) : alpha(C.blue, 0.8);
            }),
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
              title: function (items) {
                var i = items[0].dataIndex;
                return fmt(spec.edges[i]) + " to " + fmt(spec.edges[i + 1]);
              },
            },
          },
        },
      },
    });
  }

  function curves(el, spec) {
    var grid = document.createElement("div");
    grid.className = "curve-grid";
    el.appendChild(grid);
    spec.charts.forEach(function (c, i) {
      var cell = document.createElement("div");
      cell.className = "curve-cell";
      var heading = document.createElement("h3");
      heading.textContent = c.title + " ";
      var source = document.createElement("span");
      source.className = "curve-source";
      source.textContent = c.source;
      heading.appendChild(source);
      var box = document.createElement("div");
      box.className = "curve-canvas";
      cell.appendChild(heading);
      cell.appendChild(box);
      grid.appendChild(cell);
      var color = PALETTE[i % PALETTE.length];
      var radius = c.points.length < 25 ? 2 : 0;
      new Chart(canvasIn(box), {
        type: "line",
        data: {
          datasets: [
            {
              label: "raw",
              data: c.points.map(function (p) {
                return { x: p[0], y: p[1] };
              }),
              borderColor: alpha(color, 0.35),
              backgroundColor: alpha(color, 0.35),
              borderWidth: 1,
              pointRadius: radius,
            },
            {
              label: "smoothed",
              data: c.points.map(function (p) {
                return { x: p[0], y: p[2] };
              }),
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
                label: function (ctx) {
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

  var RENDERERS = {
    forest: forest,
    stacked: stacked,
    reliability: reliability,
    histogram: histogram,
    curves: curves,
  };

  document.querySelectorAll("[data-chart]").forEach(function (el) {
    var spec = specs[el.getAttribute("data-chart")];
    var render = spec && RENDERERS[spec.type];
    if (!render) {
      return;
    }
    try {
      render(el, spec);
      el.setAttribute("data-drawn", "true");
    } catch (error) {
      el.textContent = "This chart could not be drawn; its numbers are in the table and the CSV.";
      window.console.error(error);
    }
  });
})();
