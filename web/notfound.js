// The page the server answers (404) for an address that is no page, or a trace link that names no trace id.
import { topNav } from "./common.js";
import { notFoundPage } from "./errors.js";

topNav(null);
notFoundPage();
