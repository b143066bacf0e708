// Starts the trace and diff views' API requests while Plotly.js is still being parsed (a classic script,
// run before it); common.js `api()` picks the responses up by URL.
(function () {
  window.__maxShapes = Math.max(1200, Math.min(3000, Math.round(window.innerWidth * 1.5)));
  window.__prefetch = {};
  if (!window.fetch) return;
  var q = new URLSearchParams(location.search), urls = [];
  var graph = function (id, g) { return "/api/traces/" + encodeURIComponent(id) + "/graphs/" + encodeURIComponent(g); };
  var m = location.pathname.match(/^\/traces\/([^/]+)\/?$/);
  if (m) {
    var id = decodeURIComponent(m[1]), g = q.get("g") || "0";
    urls = ["/api/traces/" + encodeURIComponent(id), graph(id, g) + "/memory-map?max_shapes=" + window.__maxShapes,
      graph(id, g) + "/events?start=0&limit=200"];
  } else if (location.pathname === "/diff") {
    var ref = function (r) { var i = (r || "").lastIndexOf(":"); return i > 0 ? [r.slice(0, i), r.slice(i + 1)] : null; };
    var a = ref(q.get("a")), b = ref(q.get("b"));
    if (!a || !b) return;
    urls = ["/api/diff?a=" + encodeURIComponent(a[0] + ":" + Number(a[1])) + "&b=" + encodeURIComponent(b[0] + ":" + Number(b[1])),
      "/api/traces/" + encodeURIComponent(a[0]), graph(a[0], Number(a[1])) + "/memory-map?max_shapes=" + window.__maxShapes,
      graph(b[0], Number(b[1])) + "/memory-map?max_shapes=" + window.__maxShapes];
    if (b[0] !== a[0]) urls.push("/api/traces/" + encodeURIComponent(b[0]));
  }
  urls.forEach(function (u) {
    window.__prefetch[u] = fetch(u, { headers: { Accept: "application/json" } }).catch(function () { return null; });
  });
})();
