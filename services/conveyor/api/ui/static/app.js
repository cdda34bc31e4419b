// Live refresh: an element with data-refresh="<url>" is replaced every 5 s by the HTML fragment
// that url renders on the server (escaped there; this file never builds HTML from data).
"use strict";
function refresh(el) {
  fetch(el.dataset.refresh, { headers: { Accept: "text/html" } })
    .then(function (r) { return r.ok ? r.text() : Promise.reject(r.status); })
    .then(function (html) {
      el.innerHTML = html;
      el.dataset.refreshed = String(Number(el.dataset.refreshed || "0") + 1);
    })
    .catch(function () { /* keep the last view; try again next tick */ });
}
document.addEventListener("DOMContentLoaded", function () {
  document.querySelectorAll("[data-refresh]").forEach(function (el) {
    setInterval(function () { refresh(el); }, Number(el.dataset.interval || "5000"));
  });
});
