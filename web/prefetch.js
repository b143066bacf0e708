// Starts the trace, diff and PyTorch views' first API requests before the page's modules (and Plotly.js) run:
// a classic script at the top of the page that adds <link rel="preload" as="fetch"> for the URLs the modules
// will ask for (api.js builds the same URLs), so the browser answers their fetch() from the preload.
(function () {
  var shapes = Math.max(1200, Math.min(3000, Math.round(window.innerWidth * 1.5)));  // api.js maxShapes()
  var q = new URLSearchParams(location.search), urls = [];
  var enc = encodeURIComponent;
  var graph = function (id, g) { return "/api/traces/" + enc(id) + "/graphs/" + enc(g); };
  var m = location.pathname.match(/^\/traces\/([^/]+)\/?$/);
  if (m) {
    var id = decodeURIComponent(m[1]), g = q.get("g") || "0";  // the page opens graph 0 when none is named
    urls = ["/api/traces/" + enc(id), graph(id, g) + "/memory-map?max_shapes=" + shapes,
      graph(id, g) + "/events?start=0&limit=200"];
  } else if (location.pathname === "/diff") {
    var ref = function (r) { var i = (r || "").lastIndexOf(":"); return i > 0 ? [r.slice(0, i), Number(r.slice(i + 1))] : null; };
    var a = ref(q.get("a")), b = ref(q.get("b"));
    if (!a || !b) return;
    urls = ["/api/diff?a=" + enc(a[0] + ":" + a[1]) + "&b=" + enc(b[0] + ":" + b[1]), "/api/traces/" + enc(a[0]),
      graph(a[0], a[1]) + "/memory-map?max_shapes=" + shapes, graph(b[0], b[1]) + "/memory-map?max_shapes=" + shapes];
    if (b[0] !== a[0]) urls.push("/api/traces/" + enc(b[0]));
  } else if (location.pathname === "/torch" && q.get("id") && !q.get("a")) {
    var base = "/api/torch/traces/" + enc(q.get("id"));  // api.js torchSummary() and torchUrl.timeline()
    urls = [base, base + "/devices/" + enc(Number(q.get("device") || 0)) + "/timeline?max_points=800&max_bands=120&frames=8"];
  }
  urls.forEach(function (u) {
    var link = document.createElement("link");
    link.rel = "preload"; link.as = "fetch"; link.href = u; link.crossOrigin = "anonymous";
    document.head.appendChild(link);
  });
})();
