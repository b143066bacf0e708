// Starts the first picture's requests while Plotly (a large script) is still loading; torch.js takes them.
(() => {
  const q = new URLSearchParams(location.search);
  const id = q.get("id");
  if (!id || q.get("a")) return;
  const base = `/api/torch/traces/${encodeURIComponent(id)}`;
  const timeline = `${base}/devices/${encodeURIComponent(q.get("device") || "0")}/timeline?max_points=800&max_bands=120`;
  window.__torchPrefetch = { [base]: fetch(base), [timeline]: fetch(timeline) };
})();
