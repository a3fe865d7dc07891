module churn

go 1.22
