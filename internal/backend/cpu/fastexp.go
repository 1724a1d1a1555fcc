package cpu

import "math"

// Single-precision exponential without float64 or library calls.
//
// exp(x) = 2^n * exp(r) with n = round(x/ln2) and r = x - n*ln2 in
// [-ln2/2, ln2/2]. ln2 is split in two (Cody-Waite) so that n*ln2Hi is
// exact; exp(r) is 1 + r + r^2*q(r) with q a degree-4 polynomial fitted
// (weighted least squares refined towards minimax) to relative error
// 3e-9 on that interval, well below float32 rounding. The result is
// within 2 ulp of the correctly rounded value for every x whose exp is a
// normal float32 (the tests measure 1 ulp). Results that would be
// subnormal are flushed to zero (x < expMin, including -Inf) so that
// softmax tails never slow later arithmetic down; x > expMax gives +Inf
// and NaN gives NaN.
//
// Every product is rounded by an explicit float32 conversion so that the
// compiler cannot fuse it into a multiply-add (Go permits that, and does
// it for GOAMD64=v3): the scalar code then performs exactly the
// operations of the vector kernel in vec_amd64.s, and both give the same
// bits on every machine.
const (
	expLog2e = 1.44269504088896341
	expLn2Hi = 0.693359375 // 355/512: n*expLn2Hi is exact for |n| < 2^15
	expLn2Lo = -2.12194440e-4
	// expMagic is 1.5*2^23: adding it rounds a float32 of magnitude below
	// 2^22 to an integer held in the low mantissa bits.
	expMagic     = 12582912
	expMagicBits = 0x4b400000
	expMin       = -87.33654475 // ln(2^-126), the smallest normal result
	expMax       = 88.72283906  // ln(MaxFloat32)
	expFast      = 88.0         // below 127.5*ln2: n = round(x/ln2) <= 127

	expC2 = 4.999999345e-01
	expC3 = 1.666652069e-01
	expC4 = 4.166838737e-02
	expC5 = 8.368709842e-03
	expC6 = 1.381461285e-03
)

// expf returns e**x in float32 (see the constants above for accuracy).
// Loops should call expAffine, which is vectorised where the CPU allows.
func expf(x float32) float32 {
	if x < expMin {
		return 0
	}
	if x > expMax {
		return float32(math.Inf(1))
	}
	t := float32(x*expLog2e) + expMagic
	n := t - expMagic
	r := x - float32(n*expLn2Hi) - float32(n*expLn2Lo)
	q := expC5 + float32(r*expC6)
	q = expC4 + float32(r*q)
	q = expC3 + float32(r*q)
	q = expC2 + float32(r*q)
	p := 1 + r + float32(float32(r*r)*q)
	// The low bits of t hold n. For x <= expFast, n <= 127 and 2^n is the
	// single factor (t's bits << 23) + bias, as in the vector kernel; in
	// general it is applied as 2^h * 2^(n-h), which cannot overflow the
	// exponent field for n = 128 and, scaling by powers of two being
	// exact, gives the same result.
	k := int32(math.Float32bits(t) - expMagicBits)
	h := k >> 1
	return p * math.Float32frombits(uint32(h+127)<<23) * math.Float32frombits(uint32(k-h+127)<<23)
}

// expLanes is the width of the blocks expAffine works in.
const expLanes = 8

// expAffine sets dst[i] = exp(a*src[i] + c) for i < len(dst) and returns
// the sum of the results. dst may alias src.
//
// The sum is accumulated in a fixed order, the same on every machine:
// element j of every full block of expLanes elements is added to partial
// sum j, the partial sums are combined pairwise as
// ((s0+s4)+(s2+s6)) + ((s1+s5)+(s3+s7)), and the elements after the last
// full block are then added one by one.
func expAffine(dst, src []float32, a, c float32) float32 {
	src = src[:len(dst)]
	var acc [expLanes]float32
	full := len(dst) &^ (expLanes - 1)
	i := 0
	for i < full {
		// The vector kernel stops at a block holding an argument outside
		// its fast range; that block goes through expf.
		i += expBlocks(dst[i:full], src[i:full], a, c, &acc)
		if i < full {
			expBlockGo(dst[i:i+expLanes], src[i:i+expLanes], a, c, &acc)
			i += expLanes
		}
	}
	sum := ((acc[0] + acc[4]) + (acc[2] + acc[6])) + ((acc[1] + acc[5]) + (acc[3] + acc[7]))
	for ; i < len(dst); i++ {
		e := expf(float32(a*src[i]) + c)
		dst[i] = e
		sum += e
	}
	return sum
}

// expBlockGo is one block of expAffine in scalar code.
func expBlockGo(dst, src []float32, a, c float32, acc *[expLanes]float32) {
	dst, src = dst[:expLanes], src[:expLanes]
	for j := range dst {
		e := expf(float32(a*src[j]) + c)
		dst[j] = e
		acc[j] += e
	}
}

// expShiftSum overwrites x[i] with exp(x[i] - shift) and returns the sum
// of the results (in expAffine's order).
func expShiftSum(x []float32, shift float32) float32 {
	return expAffine(x, x, 1, -shift)
}

// expBlock is the size of the stack buffers that hold exponentials in
// loops which do not keep them.
const expBlock = 256

// sumExpShift returns the sum of exp(x[i] - shift), leaving x unchanged.
// The sum is accumulated in a fixed order.
func sumExpShift(x []float32, shift float32) float32 {
	var buf [expBlock]float32
	var s float32
	for len(x) > 0 {
		n := min(len(x), expBlock)
		s += expAffine(buf[:n], x[:n], 1, -shift)
		x = x[n:]
	}
	return s
}

// sigmoid sets dst[i] = 1/(1 + exp(-src[i])) for i < len(dst), the same
// bits on every machine. dst may alias src.
func sigmoid(dst, src []float32) {
	src = src[:len(dst)]
	full := len(dst) &^ (expLanes - 1)
	i := 0
	for i < full {
		i += sigmoidBlocks(dst[i:full], src[i:full])
		if i < full {
			for j := i; j < i+expLanes; j++ {
				dst[j] = 1 / (1 + expf(-src[j]))
			}
			i += expLanes
		}
	}
	for ; i < len(dst); i++ {
		dst[i] = 1 / (1 + expf(-src[i]))
	}
}
