// A sentence's word alignment (one entry of `alignments` in a /translate answer, with
// return_alignments) as a table: a row per source token, a column per target token, each cell
// shaded by the attention (`weights`, target x source) and dotted where the service links them.

import { element } from "./dom.js";

/** Fill `table` with `alignment`'s grid (replacing what it held). */
export function renderHeatmap(table, alignment) {
  const sources = alignment.source_tokens.map((t) => t.text);
  const targets = alignment.target_tokens.map((t) => t.text);
  const linked = new Set(alignment.pairs.map(([s, t]) => `${s},${t}`));

  const caption = element(
    "caption",
    {},
    `Word alignment of “${alignment.source}”: rows are its tokens, columns its translation's`,
  );
  const header = element("tr", {}, element("td"));
  targets.forEach((text, t) => header.append(element("th", { scope: "col", "data-t": t }, text)));
  const rows = sources.map((source, s) => {
    const row = element("tr", {}, element("th", { scope: "row", "data-s": s }, source));
    targets.forEach((target, t) => {
      row.append(cell(source, target, s, t, alignment.weights[t][s], linked.has(`${s},${t}`)));
    });
    return row;
  });
  table.replaceChildren(caption, element("thead", {}, header), element("tbody", {}, ...rows));
  table.onmouseover = (event) => highlight(table, event.target.closest("td[data-s]"));
  table.onmouseleave = () => highlight(table, null);
}

// A screen reader announces the row and column headers with a cell: its text is the weight.
function cell(source, target, s, t, weight, linked) {
  const value = `${Math.round(weight * 100)}%${linked ? ", linked" : ""}`;
  const title = `${source} → ${target}: ${value}`;
  const td = element("td", { "data-s": s, "data-t": t, title });
  // CSSOM, not a style attribute: the page's Content-Security-Policy allows no inline styles.
  td.style.setProperty("--w", weight.toFixed(3));
  if (linked) {
    td.classList.add("linked");
  }
  td.append(element("span", { class: "sr" }, value));
  return td;
}

/** Mark the row and column headers of the cell under the pointer. */
function highlight(table, td) {
  for (const th of table.querySelectorAll("th.hl")) {
    th.classList.remove("hl");
  }
  if (td) {
    table.querySelector(`th[data-s="${td.dataset.s}"]`)?.classList.add("hl");
    table.querySelector(`th[data-t="${td.dataset.t}"]`)?.classList.add("hl");
  }
}
