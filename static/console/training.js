// Training form: one press starts one run. The button is disabled once the form is sent, so
// a double click or an impatient second press does not queue the same run twice.
const form = document.querySelector("form.training-form");
if (form) {
  form.addEventListener("submit", () => {
    const button = form.querySelector("[data-start-run]");
    if (button) {
      // Disabled after the submit event has collected the form data.
      setTimeout(() => {
        button.disabled = true;
        button.textContent = "Starting…";
      }, 0);
    }
  });
}
