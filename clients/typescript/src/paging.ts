/** AIP-158 paging turned into one async iterable. */

export interface Page<Item> {
  items: Item[];
  nextPageToken: string;
}

/** Fetches the next page only when the previous one has been consumed. */
export async function* paginate<Item>(
  fetchPage: (pageToken: string) => Promise<Page<Item>>,
): AsyncGenerator<Item, void, undefined> {
  let pageToken = "";
  do {
    const page = await fetchPage(pageToken);
    yield* page.items;
    pageToken = page.nextPageToken;
  } while (pageToken !== "");
}
