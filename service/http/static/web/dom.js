// Building the page's elements from text: never through innerHTML (the Content-Security-Policy
// requires Trusted Types for it, and translations are untrusted text).

/** A new `tag` element with `attributes` and `children` (elements or text). */
export function element(tag, attributes = {}, ...children) {
  const node = document.createElement(tag);
  for (const [name, value] of Object.entries(attributes)) {
    node.setAttribute(name, String(value));
  }
  node.append(...children);
  return node;
}
