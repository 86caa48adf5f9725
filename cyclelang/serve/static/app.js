// The cyclelang playground: every change is sent to the local cyclec (POST /api/analyze),
// which answers with the diagnostics, the diagram, the report and the generated source.
// The words the highlighter colours come from the compiler's tables (GET /api/language).
"use strict";

const $ = (id) => document.getElementById(id);
const state = { words: { keywords: new Set(), kinds: new Set(), options: new Set() }, seq: 0, shown: 0, diagnostics: [], svg: null, timer: null, url: null };
window.playground = state; // for the browser test and for the curious

function escapeHtml(s) {
  return s.replace(/[&<>"]/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;" })[c]);
}

// --- highlighting: one line at a time, tokens as the grammar's lexer sees them --------------
const TOKEN = /(#[^\n]*)|("[^"\n]*"?)|(\d[\d_]*(?:\.[\d_]*)?(?:[eE][+-]?\d+)?|\.\d[\d_]*)|([A-Za-z_][A-Za-z0-9_]*)(=?)|([^#"\dA-Za-z_.]+|\.)/g;

function highlightLine(line) {
  let out = "";
  let prevWord = null;
  for (const m of line.matchAll(TOKEN)) {
    if (m[1] !== undefined) out += `<span class="com">${escapeHtml(m[1])}</span>`;
    else if (m[2] !== undefined) out += `<span class="str">${escapeHtml(m[2])}</span>`;
    else if (m[3] !== undefined) out += `<span class="num">${m[3]}</span>`;
    else if (m[4] !== undefined) {
      const w = m[4];
      let cls = "";
      if (m[5] && state.words.options.has(w)) cls = "opt";
      else if (state.words.keywords.has(w)) cls = "kw";
      else if (state.words.kinds.has(w) && prevWord !== null && state.words.keywords.has(prevWord)) cls = "kind";
      else if (state.words.options.has(w)) cls = "opt";
      out += cls ? `<span class="${cls}">${w}</span>` : w;
      out += m[5] || "";
      prevWord = w;
      continue;
    } else out += escapeHtml(m[6]);
    if (m[6] === undefined || m[6].trim()) prevWord = null;
  }
  return out;
}

function render() {
  const text = $("src").value;
  const lines = text.split("\n");
  const byLine = new Map();
  for (const d of state.diagnostics) {
    if (!byLine.has(d.line)) byLine.set(d.line, []);
    byLine.get(d.line).push(d);
  }
  const html = lines.map((line, i) => {
    const ds = byLine.get(i + 1);
    if (!ds) return `<span class="line" data-line="${i + 1}">${highlightLine(line)}</span>`;
    const worst = ["error", "warning", "note"].find((s) => ds.some((d) => d.severity === s));
    const msg = ds.map((d) => `${d.severity}[${d.code}]: ${d.message}`).join("; ");
    return `<span class="line ${worst}" data-line="${i + 1}">${highlightLine(line) || " "}</span><span class="inline ${worst}">${escapeHtml(msg)}</span>`;
  });
  $("highlight").innerHTML = html.join("\n") + "\n";
  $("gutter").textContent = lines.map((_, i) => String(i + 1)).join("\n");
  const ta = $("src");
  ta.style.height = "0px";
  ta.style.height = Math.max(ta.scrollHeight, $("editor").clientHeight) + "px";
  ta.style.width = "0px";
  ta.style.width = Math.max(ta.scrollWidth, ta.parentElement.clientWidth) + "px";
}

function showDiagnostics() {
  const ul = $("diagnostics");
  ul.textContent = "";
  for (const d of state.diagnostics) {
    const li = document.createElement("li");
    li.className = d.severity;
    li.dataset.line = d.line;
    li.dataset.code = d.code;
    li.textContent = `${d.line}:${d.column}: ${d.severity}[${d.code}]: ${d.message}`;
    if (d.help) {
      const h = document.createElement("div");
      h.className = "help";
      h.textContent = `help: ${d.help}`;
      li.appendChild(h);
    }
    li.addEventListener("click", () => goToLine(d.line, d.column));
    ul.appendChild(li);
  }
}

function goToLine(line, column) {
  const ta = $("src");
  const lines = ta.value.split("\n");
  let off = 0;
  for (let i = 0; i < line - 1 && i < lines.length; i++) off += lines[i].length + 1;
  ta.focus();
  ta.setSelectionRange(off + column - 1, off + column - 1);
}

// --- talking to cyclec ----------------------------------------------------------------------
async function analyze() {
  const seq = ++state.seq;
  document.body.dataset.state = "busy";
  $("status").textContent = "compiling…";
  const body = JSON.stringify({ text: $("src").value, view: $("view").value, labels: $("labels").value });
  let out;
  try {
    const r = await fetch("/api/analyze", { method: "POST", headers: { "Content-Type": "application/json" }, body });
    out = await r.json();
    if (!r.ok) throw new Error(out.error || r.statusText);
  } catch (e) {
    if (seq === state.seq) {
      $("status").textContent = `cyclec: ${e.message}`;
      document.body.dataset.state = "offline";
    }
    return;
  }
  if (seq < state.shown) return; // an older answer arriving late
  state.shown = seq;
  state.diagnostics = out.diagnostics;
  render();
  showDiagnostics();
  const errors = out.diagnostics.filter((d) => d.severity === "error").length;
  if (out.svg) {
    state.svg = out.svg;
    if (state.url) URL.revokeObjectURL(state.url);
    state.url = URL.createObjectURL(new Blob([out.svg], { type: "image/svg+xml" }));
    $("diagram").src = state.url;
    $("diagram").dataset.seq = String(seq);
    $("diagram").dataset.engine = out.engine || "";
  }
  $("diagram-error").textContent = out.diagram_error || (errors ? "the diagram shows the last spec that compiled" : "");
  if (out.report !== null) $("report").textContent = out.report;
  if (out.source !== null) $("source").textContent = out.source;
  $("status").textContent = errors ? `${errors} error${errors > 1 ? "s" : ""}` : out.diagnostics.length ? `${out.diagnostics.length} finding(s)` : "ok";
  document.body.dataset.state = errors ? "error" : "ok";
  document.body.dataset.seq = String(seq);
}

function changed() {
  render();
  clearTimeout(state.timer);
  state.timer_pending = true;
  state.timer = setTimeout(() => { state.timer_pending = false; analyze(); }, 120);
}

// --- share links: the spec travels in the URL's fragment, never to a server -------------------
function toBase64Url(text) {
  const bytes = new TextEncoder().encode(text);
  let bin = "";
  for (const b of bytes) bin += String.fromCharCode(b);
  return btoa(bin).replace(/\+/g, "-").replace(/\//g, "_").replace(/=+$/, "");
}

function fromBase64Url(s) {
  const bin = atob(s.replace(/-/g, "+").replace(/_/g, "/"));
  return new TextDecoder().decode(Uint8Array.from(bin, (c) => c.charCodeAt(0)));
}

function shareLink() {
  const url = `${location.origin}${location.pathname}#spec=${toBase64Url($("src").value)}`;
  history.replaceState(null, "", url);
  if (navigator.clipboard) navigator.clipboard.writeText(url).catch(() => {});
  $("status").textContent = "link in the address bar";
  return url;
}

async function start() {
  const words = await (await fetch("/api/language")).json();
  state.words = { keywords: new Set(words.keywords), kinds: new Set(words.kinds), options: new Set(words.options) };
  let text = null;
  const m = location.hash.match(/^#spec=([A-Za-z0-9_-]*)$/);
  if (m) {
    try { text = fromBase64Url(m[1]); } catch (e) { text = null; }
  }
  if (text === null) text = (await (await fetch("/api/initial")).json()).text;
  $("src").value = text;
  $("src").addEventListener("input", changed);
  $("src").addEventListener("keydown", (e) => {
    if (e.key === "Tab") {
      e.preventDefault();
      document.execCommand("insertText", false, "  ");
    }
  });
  $("view").addEventListener("change", analyze);
  $("labels").addEventListener("change", analyze);
  $("share").addEventListener("click", shareLink);
  for (const b of document.querySelectorAll(".tabs button")) {
    b.addEventListener("click", () => {
      for (const x of document.querySelectorAll(".tabs button")) x.classList.toggle("active", x === b);
      for (const p of document.querySelectorAll(".pane")) p.classList.toggle("active", p.id === `pane-${b.dataset.tab}`);
    });
  }
  state.shareLink = shareLink;
  render();
  await analyze();
}

start();
