/** Where things are, from the package root (tests run from dist/test, sources stay in test/). */
import { existsSync } from "node:fs";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";

function findPackageRoot(start: string): string {
  let dir = start;
  while (!existsSync(join(dir, "package.json"))) {
    const parent = dirname(dir);
    if (parent === dir) {
      throw new Error(`no package.json above ${start}`);
    }
    dir = parent;
  }
  return dir;
}

export const packageRoot = findPackageRoot(dirname(fileURLToPath(import.meta.url)));
/** clients/typescript sits two levels below the repository root. */
export const repoRoot = resolve(packageRoot, "..", "..");
export const tlsFixtures = join(packageRoot, "test", "fixtures", "tls");
