// The allocator state just before one event, drawn as an address bar: live tensors (coloured by op, as on the
// map) and free blocks (hatched grey) by offset; the selected event's own placement is outlined on top.
import { state } from "./api.js";
import { plotlyReady, clear, fmtBytes, fmtInt, opColor, nameColor, plotConfig, plotTheme, bytesEl, tensorLabel, FREE_COLOR, FREE_FILL } from "./common.js";
import { plotText, byteTicks } from "./memmap.js";

/**
 * Draw what the allocator saw before event i of graph ref ({id, g}) into div, a summary into note.
 * `event` is the selected event itself (its offset and size, when it placed bytes, are outlined).
 */
export async function drawState(div, note, ref, i, top, event) {
  const st = await state(ref.id, ref.g, i);
  const free = st.freeBlocks.map((b) => ({ ...b }));
  const liveTop = Math.max(0, ...st.live.map((t) => t.offset + t.size));
  for (const b of free) {
    if (b.size === null) {  // a measure run's endless last block
      b.endless = true;
      b.size = Math.max(Math.max(top || 0, liveTop) - b.offset, (top || liveTop || 1024) * 0.08);
    }
  }
  const theme = plotTheme();
  const live = st.live.map((t) => ({ ...t, label: tensorLabel(t.tensor, t.op, t.offset) }));
  const bar = (items, row, color, pattern, label) => ({
    type: "bar", orientation: "h", name: label, y: items.map(() => row), x: items.map((b) => b.size), base: items.map((b) => b.offset),
    marker: { color: items.map(color), line: { color: pattern ? FREE_COLOR : theme.paper, width: 1 },
      pattern: pattern ? { shape: "/", fgcolor: FREE_COLOR, bgcolor: FREE_FILL, size: 7, solidity: 0.25 } : undefined },
    text: items.map((b) => plotText(b.label ?? (b.endless ? "free to the end" : fmtBytes(b.size)))), textposition: "inside",
    insidetextanchor: "middle", textfont: { size: 11, color: theme.ink }, cliponaxis: true, constraintext: "inside",
    customdata: items.map((b) => [plotText(b.label ?? (b.endless ? "free to the end (no limit)" : "free block")),
      fmtBytes(b.size), b.endless ? "no limit" : `${fmtInt(b.size)} B`, fmtInt(b.offset), plotText(b.op ?? "")]),
    hovertemplate: "%{customdata[0]} %{customdata[4]}<br>%{customdata[1]} (%{customdata[2]})<br>offset %{customdata[3]}<extra></extra>",
  });
  const end = Math.max(1, top || 0, ...free.map((b) => b.offset + b.size), ...live.map((t) => t.offset + t.size));
  const ticks = byteTicks(0, end, Math.max(3, Math.min(8, Math.floor((div.clientWidth || 400) / 90))));
  const traces = [
    bar(live, "live tensors", (t) => (t.op ? opColor(t.op) : nameColor(t.tensor)), false, "live tensors"),
    bar(free, "free blocks", () => FREE_FILL, true, "free blocks"),
  ];
  const placed = event && event.offset !== undefined && event.size !== undefined && ["alloc", "reuse"].includes(event.kind);
  const shapes = placed ? [{ type: "rect", xref: "x", yref: "paper", x0: event.offset, x1: event.offset + event.size, y0: 0, y1: 1,
    line: { color: theme.accent, width: 2.5, dash: "dot" }, fillcolor: "rgba(0,0,0,0)" }] : [];
  const layout = {
    barmode: "overlay", margin: { l: 96, r: 16, t: 8, b: 36 }, showlegend: false, height: 150, shapes,
    paper_bgcolor: theme.paper, plot_bgcolor: theme.plot, font: { family: "system-ui, sans-serif", size: 12, color: theme.ink },
    xaxis: { range: [0, end], tickangle: 0, tickvals: ticks.tickvals, ticktext: ticks.ticktext, title: { text: "offset", font: { size: 11 } },
      gridcolor: theme.grid, color: theme.muted },
    yaxis: { categoryorder: "array", categoryarray: ["free blocks", "live tensors"], fixedrange: true, color: theme.muted },
  };
  div.hidden = false;
  await (await plotlyReady()).react(div, traces, layout, plotConfig({ displayModeBar: false }));
  const finite = free.filter((b) => !b.endless);
  const totalFree = finite.reduce((s, b) => s + b.size, 0);
  const largest = finite.reduce((m, b) => Math.max(m, b.size), 0);
  clear(note).append(`Before event ${fmtInt(i)} (what the allocator saw): ${fmtInt(live.length)} live tensor${live.length === 1 ? "" : "s"}, `,
    `${fmtInt(finite.length)} free block${finite.length === 1 ? "" : "s"}${finite.length < free.length ? " (plus the endless last one)" : ""} totalling `,
    bytesEl(totalFree), ", the largest ", bytesEl(largest), ".",
    placed ? ` The dotted outline is where event ${fmtInt(i)} put ${tensorLabel(event.tensor, event.op, event.offset)}.` : "");
  div.dataset.event = String(i);
  return { free, live };
}
