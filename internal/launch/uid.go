package launch

import "os"

// currentUID returns the real user id, -1 where the system has none.
func currentUID() int { return os.Getuid() }
