/*
 * Evaluation dashboard charts.
 *
 * The page carries every chart's spec in one JSON block (<script type="application/json"
 * id="dashboard-charts">, written by Django's json_script) and an empty <div data-chart="key">
 * per chart. Each spec's "type" names the module in charts/ that draws it with Chart.js
 * (static/vendor/chart.umd.min.js, a classic script that runs before this module). No inline
 * script or style anywhere (CSP): sizes are set through the CSSOM.
 */
import { curves } from "./charts/curves.js";
import { forest } from "./charts/forest.js";
import { histogram } from "./charts/histogram.js";
import { reliability } from "./charts/reliability.js";
import { stacked } from "./charts/stacked.js";
import { applyDefaults } from "./theme.js";

const RENDERERS = { curves, forest, histogram, reliability, stacked };

function drawAll() {
  const dataNode = document.getElementById("dashboard-charts");
  const Chart = window.Chart;
  if (!dataNode || typeof Chart === "undefined") {
    return;
  }
  const specs = JSON.parse(dataNode.textContent || "{}") || {};
  applyDefaults(Chart);
  document.querySelectorAll("[data-chart]").forEach((el) => {
    const spec = specs[el.getAttribute("data-chart")];
    const render = spec && RENDERERS[spec.type];
    if (!render) {
      return;
    }
    try {
      render(Chart, el, spec);
      el.setAttribute("data-drawn", "true");
    } catch (error) {
      el.textContent = "This chart could not be drawn; its numbers are in the table and the CSV.";
      window.console.error(error);
    }
  });
}

drawAll();
