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

// Live updates pushed by the server (GET /ui/events, server-sent events from the process's change feed). While
// the stream is live, the regions the change feed answers (data-feed) are refreshed when it says something
// changed, and otherwise only every MAX_QUIET_MS (what the audit log does not record, e.g. progress); the other
// regions keep polling. Without EventSource, or while the stream is down, every region polls as before.
var MAX_QUIET_MS = 10000;
var pushed = { live: false, wanted: false, last: 0 };

function setPushed(on) {
  pushed.live = on;
  document.body.classList.toggle("pushed", on);
}

function listenForChanges() {
  if (!window.EventSource || !document.getElementById("live")) { return; }
  var source = new EventSource("/ui/events");
  source.addEventListener("live", function () { setPushed(true); });
  source.addEventListener("paused", function () { setPushed(false); });
  source.addEventListener("ended", function () { setPushed(false); source.close(); });
  source.addEventListener("change", function () {
    pushed.wanted = true;
    htmx.trigger(document.body, "consolechanged");
  });
  source.addEventListener("error", function () { setPushed(false); });  // EventSource reconnects by itself
}

document.addEventListener("htmx:beforeRequest", function (event) {
  var region = event.detail.elt;
  if (!region || region.id !== "live" || !region.hasAttribute("data-feed")) { return; }
  var now = Date.now();
  if (pushed.live && !pushed.wanted && now - pushed.last < MAX_QUIET_MS) {
    event.preventDefault();  // nothing changed: the stream would have said so
    return;
  }
  pushed.wanted = false;
  pushed.last = now;
});
document.addEventListener("DOMContentLoaded", listenForChanges);
