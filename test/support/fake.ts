/**
 * A test double with only the members a test uses. Their types are checked against T's (a fake
 * method returning the wrong shape fails to compile), which a bare `as unknown as T` would hide.
 */
export function fake<T>(members: Partial<T>): T {
  return members as T;
}
