// The inbox page works without this script; with it, a page that asks for it
// (<body data-refresh="seconds">) refreshes its content in place while visible.
(function () {
  "use strict";
  var seconds = Number(document.body.dataset.refresh || 0);
  if (!seconds) return;
  function refresh() {
    if (document.hidden) return;
    fetch(window.location.href, { credentials: "same-origin", cache: "no-store" })
      .then(function (response) {
        if (!response.ok || response.redirected) throw new Error("not refreshed");
        return response.text();
      })
      .then(function (html) {
        var fresh = new DOMParser().parseFromString(html, "text/html");
        var main = fresh.getElementById("main");
        var footer = fresh.querySelector("footer");
        if (main) document.getElementById("main").replaceWith(main);
        if (footer) document.querySelector("footer").replaceWith(footer);
      })
      .catch(function () { /* keep the page as it is; try again later */ });
  }
  window.setInterval(refresh, seconds * 1000);
})();
