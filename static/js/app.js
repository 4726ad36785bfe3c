/* Site-wide script: CSRF header for htmx requests, read from <meta name="csrf-token">. */
(function () {
  "use strict";

  function csrfToken() {
    var meta = document.querySelector('meta[name="csrf-token"]');
    return meta ? meta.getAttribute("content") : "";
  }

  window.prefloop = window.prefloop || {};
  window.prefloop.csrfToken = csrfToken;

  document.addEventListener("htmx:configRequest", function (event) {
    event.detail.headers["X-CSRFToken"] = csrfToken();
  });
})();
