// The two small element makers both modes' lists use.

export function element(tag, className = "") {
  const node = document.createElement(tag);
  if (className) node.className = className;
  return node;
}

/** An icon button whose click does `onClick` and nothing else (not its row's click). */
export function button(text, title, onClick) {
  const node = element("button", "icon");
  node.type = "button";
  node.textContent = text;
  node.title = title;
  node.addEventListener("click", (event) => {
    event.stopPropagation();
    onClick();
  });
  return node;
}
