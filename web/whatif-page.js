// The /whatif page: the what-if panel on its own, for a trace named in the URL (linked from the PyTorch page).
import { whatIfPage } from "./whatif.js";

whatIfPage();
