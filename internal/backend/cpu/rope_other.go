//go:build !amd64

package cpu

// useRoPEAVX512 is always false off amd64; the tests toggle it on every
// architecture.
var useRoPEAVX512 = false

// ropeFwdVec leaves every row to ropeFwdGo.
func ropeFwdVec(o, x, c, s []float32, nh int) bool { return false }

// ropeBwdVec leaves every row to ropeBwdGo.
func ropeBwdVec(dx, d, c, s []float32, nh int) bool { return false }
