// Package process answers questions about the operating system's
// processes that several parts of titan ask: whether the process that
// owns a lock, a temporary folder or a running run record is still alive.
package process
