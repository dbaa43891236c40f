// The console's only script: refresh server-rendered fragments, and "select all" on the DLQ page.
// Fragments are HTML the server rendered and escaped; no value is built into markup here.
"use strict";

function refresh(box) {
  const url = box.dataset.refresh;
  const every = Math.max(parseFloat(box.dataset.every || "3"), 0.5) * 1000;
  const until = box.dataset.until;
  const tick = async () => {
    try {
      const response = await fetch(url, { credentials: "same-origin", headers: { Accept: "text/html" } });
      if (response.ok) {
        box.innerHTML = await response.text();
        if (until && box.querySelector(`[data-state="${until}"]`)) {
          return;
        }
      }
    } catch (err) {
      // the console is restarting or the network blinked: try again at the next tick
    }
    setTimeout(tick, every);
  };
  if (until && box.querySelector(`[data-state="${until}"]`)) {
    return;
  }
  setTimeout(tick, every);
}

document.addEventListener("DOMContentLoaded", () => {
  document.querySelectorAll("[data-refresh]").forEach(refresh);
  const all = document.getElementById("select-all");
  if (all) {
    all.addEventListener("change", () => {
      document.querySelectorAll("input.pick:not([disabled])").forEach((box) => { box.checked = all.checked; });
    });
  }
});
