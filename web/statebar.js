// The allocator state at one event, drawn as an address bar: live tensors and free blocks by offset.
import { api, el, clear, fmtBytes, exactBytes, fmtInt, opColor, hashColor, pick, bytesEl } from "/static/common.js";
import { plotText, byteTicks } from "/static/memmap.js";

/** Draw the state of `base` (graph API path) at event i into div; a summary line goes into note. */
export async function drawState(div, note, base, i, top, nEvents) {
  // the API counts events applied; the state "at" event i is the one after it happened
  const applied = nEvents ? Math.min(i + 1, nEvents) : i + 1;
  const st = await api(`${base}/state?event=${encodeURIComponent(applied)}`);
  const free = (st.free_blocks || st.free || []).map((b) => Array.isArray(b)
    ? { offset: b[0], size: b[1], chunk: b[2] } : { offset: pick(b, "offset"), size: b.size, chunk: pick(b, "chunk") });
  const liveTop = Math.max(0, ...(st.live || st.live_tensors || []).map((t) => (pick(t, "offset") || 0) + (pick(t, "size") || 0)));
  for (const b of free) {
    if (b.size === null || b.size === undefined) {  // a measure run's endless last block
      b.endless = true;
      b.size = Math.max(Math.max(top || 0, liveTop) - b.offset, (top || liveTop || 1024) * 0.08);
      b.tensor = "free to the end (no limit)";
    }
  }
  const live = (st.live || st.live_tensors || []).map((t) => ({ tensor: pick(t, "tensor", "name") ?? "", offset: pick(t, "offset"),
    size: pick(t, "size"), chunk: pick(t, "chunk"), op: pick(t, "op") }));
  const bar = (items, row, color, label) => ({
    type: "bar", orientation: "h", name: label, y: items.map(() => row), x: items.map((b) => b.size), base: items.map((b) => b.offset),
    marker: { color: items.map(color), line: { color: "#ffffff", width: 1 } },
    text: items.map((b) => plotText(b.tensor ?? fmtBytes(b.size))), textposition: "inside", insidetextanchor: "middle",
    textfont: { size: 11 }, cliponaxis: true, constraintext: "inside",
    customdata: items.map((b) => [plotText(b.tensor ?? "free block"), fmtBytes(b.size), b.size, b.offset, b.chunk ?? 0]),
    hovertemplate: "%{customdata[0]}<br>%{customdata[1]} (%{customdata[2]:,} bytes)<br>offset %{customdata[3]:,}, chunk %{customdata[4]}<extra></extra>",
  });
  const end = Math.max(1, top || 0, ...free.map((b) => b.offset + b.size), ...live.map((t) => t.offset + t.size));
  const ticks = byteTicks(0, end, Math.max(3, Math.min(8, Math.floor((div.clientWidth || 400) / 90))));
  const traces = [
    bar(live, "live tensors", (t) => (t.op ? opColor(t.op) : hashColor(t.tensor)), "live tensors"),
    bar(free, "free blocks", (b) => (b.endless ? "#c9e8d3" : "#7cc294"), "free blocks"),
  ];
  const layout = {
    barmode: "overlay", margin: { l: 96, r: 16, t: 8, b: 36 }, showlegend: false, height: 150,
    paper_bgcolor: "#ffffff", plot_bgcolor: "#fbfcfe", font: { family: "system-ui, sans-serif", size: 12, color: "#1d2330" },
    xaxis: { range: [0, end], tickangle: 0, tickvals: ticks.tickvals, ticktext: ticks.ticktext, title: { text: "offset", font: { size: 11 } }, gridcolor: "#eceff4" },
    yaxis: { categoryorder: "array", categoryarray: ["free blocks", "live tensors"], fixedrange: true },
  };
  div.hidden = false;
  await Plotly.react(div, traces, layout, { responsive: true, displaylogo: false, displayModeBar: false });
  const finite = free.filter((b) => !b.endless);
  const totalFree = finite.reduce((s, b) => s + b.size, 0);
  const largest = finite.reduce((m, b) => Math.max(m, b.size), 0);
  clear(note).append(`After event ${fmtInt(i)}: ${fmtInt(live.length)} live tensor${live.length === 1 ? "" : "s"}, `,
    `${fmtInt(finite.length)} free block${finite.length === 1 ? "" : "s"}${finite.length < free.length ? " (plus the endless last one)" : ""} totalling `, bytesEl(totalFree), ", the largest ", bytesEl(largest), ".");
  return { free, live };
}
