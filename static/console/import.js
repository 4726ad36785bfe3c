/* Import form: a file input that also takes drops, and a preview of the file's first rows.

The preview reads only the start of the file in the browser (through gzip for .gz) and
writes every value with textContent, so nothing in the file runs or styles the page.
*/
const PREVIEW_BYTES = 256 * 1024;
const CELL_CHARS = 120;

function short(text) {
  const value = String(text ?? "");
  return value.length > CELL_CHARS ? `${value.slice(0, CELL_CHARS)}…` : value;
}

async function headText(file) {
  if (file.name.endsWith(".gz") && "DecompressionStream" in window) {
    const stream = file.stream().pipeThrough(new DecompressionStream("gzip"));
    const reader = stream.getReader();
    const decoder = new TextDecoder();
    let text = "";
    while (text.length < PREVIEW_BYTES) {
      const { value, done } = await reader.read();
      if (done) break;
      text += decoder.decode(value, { stream: true });
    }
    reader.cancel().catch(() => {});
    return text;
  }
  return file.slice(0, PREVIEW_BYTES).text();
}

function promptOf(row) {
  if (typeof row.prompt === "string") return row.prompt;
  const turns = Array.isArray(row.messages) ? row.messages : Array.isArray(row.prompt) ? row.prompt : [];
  const last = turns.filter((m) => m && m.role === "user").pop();
  if (last) return last.content;
  if (typeof row.chosen === "string") return row.chosen.split("\n\nAssistant:")[0];
  return "";
}

function answersOf(row) {
  if (Array.isArray(row.candidates)) {
    return row.candidates.map((c, i) => `${"ABCDEFGH"[i] || i + 1}: ${short(typeof c === "string" ? c : c && c.text)}`);
  }
  const out = [];
  for (const key of ["chosen", "rejected"]) {
    if (key in row) out.push(`${key}: ${short(typeof row[key] === "string" ? row[key] : JSON.stringify(row[key]))}`);
  }
  return out;
}

// A glance only: cells are split at commas, so a quoted comma shifts the preview's columns;
// the server's CSV reader decides what is imported.
function csvRows(lines) {
  const header = lines[0].split(",");
  return lines.slice(1).map((line) => {
    const cells = line.split(",");
    const row = {};
    header.forEach((name, i) => { row[name.trim()] = cells[i]; });
    const answers = header.filter((name) => name.trim().startsWith("candidate_")).map((name) => row[name.trim()]);
    return { prompt: row.prompt, candidates: answers };
  });
}

function cell(tr, text) {
  const td = document.createElement("td");
  td.textContent = text;
  tr.append(td);
}

async function showPreview(input, box) {
  const file = input.files && input.files[0];
  const body = box.querySelector("tbody");
  const note = box.querySelector("[data-preview-note]");
  body.replaceChildren();
  if (!file) { box.hidden = true; return; }
  const wanted = Number(box.dataset.rows || 5);
  const text = await headText(file);
  let lines = text.split(/\r?\n/);
  if (text.length >= PREVIEW_BYTES) lines = lines.slice(0, -1); // a line cut short
  const isCsv = /\.csv(\.gz)?$/.test(file.name);
  let rows;
  let problems = 0;
  if (isCsv) {
    rows = csvRows(lines.filter((l) => l.trim())).slice(0, wanted).map((row, i) => ({ line: i + 2, row }));
  } else {
    rows = [];
    lines.forEach((line, i) => {
      if (!line.trim() || rows.length >= wanted) return;
      try { rows.push({ line: i + 1, row: JSON.parse(line) }); } catch (err) { rows.push({ line: i + 1, error: "not valid JSON" }); problems += 1; }
    });
  }
  for (const { line, row, error } of rows) {
    const tr = document.createElement("tr");
    cell(tr, String(line));
    if (error) {
      cell(tr, error);
      cell(tr, "");
      tr.classList.add("bad");
    } else {
      cell(tr, short(promptOf(row)));
      cell(tr, answersOf(row).join("  ·  "));
    }
    body.append(tr);
  }
  note.textContent = `${file.name}, ${(file.size / 1024).toFixed(1)} KB. ` +
    (problems ? `${problems} of these rows cannot be read. ` : "") +
    "The server checks every line when you import; nothing is stored unless all lines are good.";
  box.hidden = false;
}

function guessFormat(form, file) {
  const kind = form.querySelector("[name=kind]");
  const format = form.querySelector("[name=format]");
  if (!kind || !format || kind.value !== "items") return;
  format.value = /\.csv(\.gz)?$/.test(file.name) ? "csv" : "jsonl";
}

function setUp(form) {
  const zone = form.querySelector("[data-dropzone]");
  const input = zone.querySelector("input[type=file]");
  const box = form.querySelector("#import-preview");
  const changed = () => {
    if (input.files && input.files[0]) guessFormat(form, input.files[0]);
    showPreview(input, box).catch(() => { box.hidden = true; });
  };
  input.addEventListener("change", changed);
  zone.addEventListener("dragover", (event) => { event.preventDefault(); zone.classList.add("is-over"); });
  zone.addEventListener("dragleave", () => zone.classList.remove("is-over"));
  zone.addEventListener("drop", (event) => {
    event.preventDefault();
    zone.classList.remove("is-over");
    if (event.dataTransfer && event.dataTransfer.files.length) {
      input.files = event.dataTransfer.files;
      changed();
    }
  });
}

const form = document.getElementById("import-form");
if (form) setUp(form);
