"""One module per dashboard page; each turns `ProjectData` into that page's panels."""
