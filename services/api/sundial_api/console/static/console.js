// Sundial console: htmx settings. The Content-Security-Policy allows no inline style, so htmx must not
// inject its indicator <style> element; the stylesheet styles .htmx-request itself.
htmx.config.includeIndicatorStyles = false;
htmx.config.allowEval = false;
htmx.config.allowScriptTags = false;
htmx.config.historyCacheSize = 0;

// Say when the page is not live: a refresh that fails marks the body until one succeeds again.
document.addEventListener("htmx:sendError", function () { document.body.classList.add("not-live"); });
document.addEventListener("htmx:responseError", function () { document.body.classList.add("not-live"); });
document.addEventListener("htmx:afterSwap", function () { document.body.classList.remove("not-live"); });

// Times the viewer asked to see in the browser's own zone (<time data-local>): the server wrote them in UTC.
function showLocalTimes(root) {
  root.querySelectorAll("time[data-local]").forEach(function (t) {
    var instant = new Date(t.getAttribute("datetime"));
    if (isNaN(instant.getTime())) { return; }
    t.textContent = instant.toLocaleString(undefined, {
      year: "numeric", month: "2-digit", day: "2-digit", hour: "2-digit", minute: "2-digit", second: "2-digit",
      hour12: false, timeZoneName: "short"
    });
    t.title = t.getAttribute("datetime");
  });
}
document.addEventListener("DOMContentLoaded", function () { showLocalTimes(document); });
document.addEventListener("htmx:afterSettle", function () { showLocalTimes(document); });
