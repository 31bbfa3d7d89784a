package pods

// lifePhase is where a pod is in its life on this node, as its worker has brought it there.
// It is not the API's pod phase (Pending, Running...), which the status reports; it is what
// the worker has done with the pod, and so what it may still do.
//
//	             admitted                   ran out                  released
//	admitting ───────────▶ running ──────────────────▶ finishing ──────────────▶ finished
//	    │                     │   (containers done under    │     (what still ran      │
//	    │ rejected            │    the restart policy,      │      stopped, network     │
//	    ▼                     │    past activeDeadline-     │      and volumes gone)    │
//	rejected                  │    Seconds, or evicted)     │                           │
//	    │                     │                             │                           │
//	    └─────────────────────┴──────────────┬──────────────┴───────────────────────────┘
//	                                         │ removed by its source, or deleted in the API
//	                                         ▼
//	                                    terminating ──────────────▶ terminated
//	                                             containers, network,
//	                                             volumes, directories gone
//
// One arrow is not drawn: admitting ─▶ finishing, for a pod its source reports finished
// (Succeeded or Failed) of which nothing runs here: it is never admitted or started again.
//
// Only the worker's goroutine moves its pod (worker.moveTo), at the step of its sync that
// did what the new phase says; the orders that lead there come from outside and are kept
// beside the phase, each in a field of its own: the removal (Manager.Remove, or an orphan
// found by the relist), the deletion (the pod's deletionTimestamp), the eviction
// (Manager.Evict) and the restart (Manager.Restart). A terminating pod remembers the phase
// its termination began in (worker.terminatedFrom): a pod that had finished does not count
// in admission again, and its resources stay released, while its containers are removed.
//
// Nothing goes back: a pod delivered again by its source while it terminates (a static
// manifest put back, same UID) gets a new worker once this one has terminated.
type lifePhase int

const (
	// phaseAdmitting: the worker was made for the pod; its admission is not decided yet (or
	// the pod waits for the previous version of its static pod to stop).
	phaseAdmitting lifePhase = iota
	// phaseRejected: admission refused the pod; its rejection is reported, nothing runs.
	phaseRejected
	// phaseRunning: admitted; its containers are run by its spec and restart policy.
	phaseRunning
	// phaseFinishing: its run is over (Succeeded or Failed); it no longer counts in
	// admission; what still runs is being stopped and its network and volumes released.
	phaseFinishing
	// phaseFinished: finished and cleaned up; only its status is reported, from its exited
	// containers, until it is removed or deleted.
	phaseFinished
	// phaseTerminating: removed by its source or deleted; its containers, network, volumes
	// and directories are going, with its grace period.
	phaseTerminating
	// phaseTerminated: nothing of the pod is left on the node; its worker ends.
	phaseTerminated
)

func (p lifePhase) String() string {
	switch p {
	case phaseAdmitting:
		return "admitting"
	case phaseRejected:
		return "rejected"
	case phaseRunning:
		return "running"
	case phaseFinishing:
		return "finishing"
	case phaseFinished:
		return "finished"
	case phaseTerminating:
		return "terminating"
	case phaseTerminated:
		return "terminated"
	}
	return "lifePhase(unknown)"
}

// canMoveTo reports whether the drawing above has an arrow from p to next.
func (p lifePhase) canMoveTo(next lifePhase) bool {
	switch p {
	case phaseAdmitting:
		return next == phaseRejected || next == phaseRunning || next == phaseFinishing || next == phaseTerminating
	case phaseRunning:
		return next == phaseFinishing || next == phaseTerminating
	case phaseFinishing:
		return next == phaseFinished || next == phaseTerminating
	case phaseRejected, phaseFinished:
		return next == phaseTerminating
	case phaseTerminating:
		return next == phaseTerminated
	}
	return false
}

// moveTo moves the worker's pod to phase next (staying in the same phase is no move) and
// reports whether it did. A transition the drawing has no arrow for is a bug: it is refused
// and logged, and the pod stays where it is. Only the worker's goroutine calls it.
func (w *worker) moveTo(next lifePhase) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.moveToLocked(next)
}

// moveToLocked is moveTo with w.mu held.
func (w *worker) moveToLocked(next lifePhase) bool {
	if w.phase == next {
		return true
	}
	if !w.phase.canMoveTo(next) {
		w.m.log.Error("illegal pod phase transition refused", "pod", w.pod.Namespace+"/"+w.pod.Name, "uid", w.pod.UID,
			"from", w.phase, "to", next)
		return false
	}
	if next == phaseTerminating {
		w.terminatedFrom = w.phase
	}
	w.phase = next
	return true
}

// currentPhase is the pod's phase, for goroutines other than the worker's.
func (w *worker) currentPhase() lifePhase {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.phase
}

// runPhaseLocked is how far the pod's run got: its phase, or once its termination began,
// the phase that termination began in. w.mu held (or the worker's goroutine).
func (w *worker) runPhaseLocked() lifePhase {
	if w.phase == phaseTerminating || w.phase == phaseTerminated {
		return w.terminatedFrom
	}
	return w.phase
}

// terminalLocked: the pod finished (Succeeded or Failed) on this node, whatever came after;
// it no longer counts in admission. w.mu held.
func (w *worker) terminalLocked() bool {
	p := w.runPhaseLocked()
	return p == phaseFinishing || p == phaseFinished
}

// cleanedLocked: the pod finished and its containers are stopped, its network and volumes
// released. w.mu held.
func (w *worker) cleanedLocked() bool {
	return w.runPhaseLocked() == phaseFinished
}

// removalOrder is a pod's authoritative removal: its source no longer has it (or no source
// ever claimed its containers), and it is terminated.
type removalOrder struct {
	reason string // why it was removed, for the event and the log
	// orphan: containers found that no source claims (the pod was deleted while the agent
	// was down): the worker has only a stub of the pod, and no status to report.
	orphan bool
}
