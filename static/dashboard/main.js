/*
 * Evaluation dashboard charts.
 *
 * The page carries every chart's spec in one JSON block (<script type="application/json"
 * id="dashboard-charts">, written by Django's json_script) and an empty <div data-chart="key">
 * per chart. Each spec's "type" names the module in charts/ that draws it with Chart.js
 * (static/vendor/chart.umd.min.js, a classic script that runs before this module). No inline
 * script or style anywhere (CSP): sizes are set through the CSSOM. A live panel, polled by
 * htmx, carries its own spec (attribute data-chart-spec) and is drawn when it arrives.
 */
import { curves } from "./charts/curves.js";
import { forest } from "./charts/forest.js";
import { histogram } from "./charts/histogram.js";
import { lines } from "./charts/lines.js";
import { reliability } from "./charts/reliability.js";
import { scatter } from "./charts/scatter.js";
import { stacked } from "./charts/stacked.js";
import { applyDefaults } from "./theme.js";

const RENDERERS = { curves, forest, histogram, lines, reliability, scatter, stacked };

function specOf(el, pageSpecs) {
  // A live panel brings its own spec (htmx drops <script> elements from what it swaps in);
  // otherwise the page's block has it.
  const own = el.getAttribute("data-chart-spec");
  return own ? JSON.parse(own) : pageSpecs[el.getAttribute("data-chart")];
}

function drawIn(root) {
  const Chart = window.Chart;
  if (typeof Chart === "undefined") {
    return;
  }
  const dataNode = document.getElementById("dashboard-charts");
  const pageSpecs = dataNode ? JSON.parse(dataNode.textContent || "{}") || {} : {};
  applyDefaults(Chart);
  root.querySelectorAll("[data-chart]:not([data-drawn])").forEach((el) => {
    const spec = specOf(el, pageSpecs);
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

drawIn(document);
// Live panels (runs, progress, QC state) come back from htmx every few seconds: draw their
// charts as they arrive; charts already drawn are left alone.
document.addEventListener("htmx:load", (event) => drawIn(event.detail.elt));
