// The API reference, drawn from the server's OpenAPI description by the dashboard itself: it needs no file
// from another site, so it works offline and behind the same token as the API.
import { apiSchema } from "./api.js";
import { $, el, clear, topNav, showError } from "./common.js";

/** A parameter's type in words: "integer", "string (^[0-9a-f]{8}$)", "integer or null". */
function typeText(schema) {
  if (!schema) return "";
  if (schema.anyOf) return schema.anyOf.map(typeText).filter(Boolean).join(" or ");
  return schema.type ? schema.type + (schema.pattern ? ` (${schema.pattern})` : "") : "";
}

function endpoint(path, method, op) {
  const params = (op.parameters || []).map((p) => el("tr", {},
    el("td", {}, el("code", {}, p.name)), el("td", {}, p.in), el("td", {}, typeText(p.schema)),
    el("td", {}, p.required ? "required" : "optional"), el("td", {}, p.description || "")));
  return el("section", { class: "panel endpoint", dataset: { path, method } },
    el("h2", { class: "tensor" }, el("span", { class: `badge method ${method}` }, method.toUpperCase()), " ", path),
    op.summary ? el("p", {}, op.summary) : null,
    op.description ? el("p", { class: "hint" }, op.description) : null,
    params.length ? el("div", { class: "table-scroll" }, el("table", { class: "data plain-head" },
      el("thead", {}, el("tr", {}, ["name", "in", "type", "", ""].map((h) => el("th", {}, h)))), el("tbody", {}, params))) : null,
    op.requestBody ? el("p", { class: "hint" }, "Body: ", Object.keys(op.requestBody.content || {}).join(", ")) : null);
}

async function main() {
  topNav(null);
  const box = $("endpoints");
  try {
    const schema = await apiSchema();
    const sections = [];
    for (const [path, methods] of Object.entries(schema.paths || {}).sort(([a], [b]) => a.localeCompare(b))) {
      for (const [method, op] of Object.entries(methods)) sections.push(endpoint(path, method, op));
    }
    clear(box).append(el("p", { class: "hint", id: "endpoint-count" }, `${sections.length} endpoints.`), ...sections);
    document.body.dataset.loaded = "1";
  } catch (e) { showError(box, e); document.body.dataset.loaded = "error"; }
}
main();
