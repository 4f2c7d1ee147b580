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
