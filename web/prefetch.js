// Starts the trace view's API requests while Plotly.js is still being parsed (a classic script,
// run before it); common.js `api()` picks the responses up by URL.
(function () {
  window.__maxShapes = Math.max(1200, Math.min(3000, Math.round(window.innerWidth * 1.5)));
  window.__prefetch = {};
  var m = location.pathname.match(/^\/traces\/([^/]+)\/?$/);
  if (!m || !window.fetch) return;
  var base = "/api/traces/" + encodeURIComponent(decodeURIComponent(m[1]));
  var g = new URLSearchParams(location.search).get("g") || "0";
  var urls = [base, base + "/graphs/" + encodeURIComponent(g) + "/memory-map?max_shapes=" + window.__maxShapes,
    base + "/graphs/" + encodeURIComponent(g) + "/events?start=0&limit=200"];
  urls.forEach(function (u) {
    window.__prefetch[u] = fetch(u, { headers: { Accept: "application/json" } }).catch(function () { return null; });
  });
})();
