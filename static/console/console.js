/* Console pages: let htmx show the 4xx pages the server renders (bad input, bad lines). */
document.addEventListener("htmx:beforeSwap", (event) => {
  const status = event.detail.xhr.status;
  if (status >= 400 && status < 500 && event.detail.target.closest(".console-page")) {
    event.detail.shouldSwap = true;
    event.detail.isError = false;
  }
});
