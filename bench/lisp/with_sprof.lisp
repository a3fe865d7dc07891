;;;; Runs tests/lisp/import_job.lisp under sb-sprof's allocation profiler (what seed 004
;;;; used to find its allocation sites), for bench/sbcl.sh.
;;;; Usage: sbcl --script with_sprof.lisp JOB ROUNDS IDLE-SECONDS
(require :sb-sprof)
(let ((job (second sb-ext:*posix-argv*)))
  (setf sb-ext:*posix-argv* (cons "job" (cddr sb-ext:*posix-argv*)))
  (sb-sprof:with-profiling (:mode :alloc :report nil)
    (load job)))
