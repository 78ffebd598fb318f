// Package hashmix folds words into a hash for the tracer's own hash
// tables (the join's tuple index, the attribution cache): the multiply
// and fold of wyhash, cheaper than hash/maphash on fixed-size keys.
package hashmix

import "math/bits"

// Mix folds two words into one by their 128-bit product.
func Mix(a, b uint64) uint64 {
	hi, lo := bits.Mul64(a, b^0x94d049bb133111eb)
	return hi ^ lo
}
