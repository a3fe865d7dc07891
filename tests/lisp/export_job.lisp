;;;; An export job shaped like seed 004's allocation: documents rendered to XML by
;;;; joining their pieces with REDUCE and CONCATENATE (each step copies everything so
;;;; far), reports written through string streams (a row at a time, by a local
;;;; function), rows parsed into lists and small strings, and blobs read into large
;;;; octet vectors. Each phase runs one function and prints the bytes it consed, as
;;;; sb-ext:get-bytes-consed counts them: what the recorded Lisp allocation sites are
;;;; checked against. With THREADS above 1 every phase runs in that many threads at once.
;;;; Usage: sbcl --script export_job.lisp [SCALE] [THREADS]

(defvar *scale* (parse-integer (or (second sb-ext:*posix-argv*) "1")))
(defvar *threads* (parse-integer (or (third sb-ext:*posix-argv*) "1")))
(defvar *sink* nil)

(defun element-pieces (i)
  (loop for k below 60
        collect (format nil "<item id=\"~d\">~d</item>" k (+ i k))))

(defun sexp->xml (i)
  (reduce (lambda (a b) (concatenate 'string a b)) (element-pieces i)))

(defun export-xml (n)
  (dotimes (i n) (setf *sink* (sexp->xml i))))

(defun render-report (i)
  (with-output-to-string (s)
    (flet ((row (k) (format s "row ~d: ~a ~,3f~%" k (* i k) (/ k 7.0))))
      (declare (notinline row))
      (dotimes (k 200) (row k)))))

(defun export-reports (n)
  (dotimes (i n) (setf *sink* (render-report i))))

(defun parse-row (i)
  (loop for k below 40
        collect (cons (make-string 12 :initial-element #\x) (list i k (* i k)))))

(defun parse-rows (n)
  (dotimes (i n) (setf *sink* (parse-row i))))

(defun load-blobs (n)
  (dotimes (i n) (setf *sink* (make-array (* 256 1024) :element-type '(unsigned-byte 8)))))

(defun run-phase (name fn n)
  (let ((before (sb-ext:get-bytes-consed)))
    (if (> *threads* 1)
        (mapc #'sb-thread:join-thread
              (loop repeat *threads*
                    collect (sb-thread:make-thread (lambda () (funcall fn n)))))
        (funcall fn n))
    (format t "~a ~d~%" name (- (sb-ext:get-bytes-consed) before))
    (finish-output)))

(run-phase "EXPORT-XML" #'export-xml (* 2500 *scale*))
(run-phase "EXPORT-REPORTS" #'export-reports (* 1200 *scale*))
(run-phase "PARSE-ROWS" #'parse-rows (* 40000 *scale*))
(run-phase "LOAD-BLOBS" #'load-blobs (* 500 *scale*))
