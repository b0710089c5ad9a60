// Package anatomy shows where a round trip's time goes: it records when a
// message passes each hop of its way from one application through two
// siwtun daemons to the other application, and assembles those stamps
// into, for each direction, the median and 99th percentile of every hop.
//
// A Recorder belongs to one daemon (its netstack creates it); the engine,
// the TCP/IP stack and the link stamp hops into it, keyed by the data's
// TCP ports and sequence numbers, which both daemons see alike. While it
// is off a stamp site costs one atomic load and a branch; while it is on, a
// clock read and a few atomic stores into a fixed ring, with no
// allocation. The applications' own stamps (Post, Seen) are handed to the
// daemon over the control socket after the run. All stamps come from Now,
// CLOCK_MONOTONIC, one clock for every process of the host.
//
// Assemble joins the records of the two daemons into an Anatomy; its
// String is the table `siwtun perf write --lat --anatomy` prints, and the
// web view (`siwtun web`, the anatomy lesson) draws the same figures.
package anatomy
